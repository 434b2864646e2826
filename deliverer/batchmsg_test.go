package deliverer

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// recordedMsg is a jetstream.Msg that records how it was settled.
type recordedMsg struct {
	jetstream.Msg // nil: only the methods below are called
	header        nats.Header
	data          []byte

	mu       sync.Mutex
	settled  []string
	delay    time.Duration
	progress int
}

func (m *recordedMsg) Headers() nats.Header { return m.header }
func (m *recordedMsg) Data() []byte         { return m.data }
func (m *recordedMsg) Subject() string      { return "aurora.outbox.x.t.0" }
func (m *recordedMsg) record(s string, d time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.settled = append(m.settled, s)
	m.delay = d
	return nil
}
func (m *recordedMsg) Ack() error                         { return m.record("ack", 0) }
func (m *recordedMsg) Nak() error                         { return m.record("nak", 0) }
func (m *recordedMsg) NakWithDelay(d time.Duration) error { return m.record("nak_delay", d) }
func (m *recordedMsg) Term() error                        { return m.record("term", 0) }
func (m *recordedMsg) InProgress() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.progress++
	return nil
}

func batchOf(entries ...outbox.BatchEntry) *recordedMsg {
	return &recordedMsg{
		header: nats.Header{outbox.HeaderBatch: []string{"n"}, outbox.HeaderDatabase: []string{"db1"}},
		data:   outbox.Batch{Items: entries}.Encode(),
	}
}

func entry(id int64) outbox.BatchEntry {
	return outbox.BatchEntry{Subject: "aurora.outbox.x.t.0", Message: outbox.Message{ItemID: id, Key: strings.Repeat("k", 64), Dispatch: 1}}
}

// TestBatchMessageSettlement: the answer table of a batch message — settled
// once, by its last item: Ack when every item acked or terminated, else
// NakWithDelay with the longest delay asked (Nak when none).
func TestBatchMessageSettlement(t *testing.T) {
	t.Parallel()
	type op func(jetstream.Msg) error
	ack := func(m jetstream.Msg) error { return m.Ack() }
	term := func(m jetstream.Msg) error { return m.Term() }
	nak := func(m jetstream.Msg) error { return m.Nak() }
	nakIn := func(d time.Duration) op { return func(m jetstream.Msg) error { return m.NakWithDelay(d) } }
	cases := []struct {
		name      string
		ops       []op
		want      string
		wantDelay time.Duration
	}{
		{"all acked", []op{ack, ack, ack}, "ack", 0},
		{"acked and terminated", []op{ack, term, ack}, "ack", 0},
		{"all terminated", []op{term, term}, "ack", 0},
		{"one nak", []op{ack, nak, ack}, "nak", 0},
		{"naks with delays: the longest", []op{nakIn(2 * time.Second), ack, nakIn(5 * time.Second), nakIn(time.Second)}, "nak_delay", 5 * time.Second},
		{"nak then nak with delay", []op{nak, nakIn(3 * time.Second)}, "nak_delay", 3 * time.Second},
		{"one item", []op{ack}, "ack", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			es := make([]outbox.BatchEntry, len(c.ops))
			for i := range es {
				es[i] = entry(int64(i + 1))
			}
			parent := batchOf(es...)
			items, bad, why, ok := splitBatch(parent)
			if !ok || bad != 0 || why != nil || len(items) != len(c.ops) {
				t.Fatalf("split: %d items, %d bad, ok %v", len(items), bad, ok)
			}
			for i, o := range c.ops {
				if err := o(items[i]); err != nil {
					t.Fatalf("item %d: %v", i, err)
				}
				if i < len(c.ops)-1 && len(parent.settled) != 0 {
					t.Fatalf("settled before its last item: %v", parent.settled)
				}
			}
			if len(parent.settled) != 1 || parent.settled[0] != c.want || parent.delay != c.wantDelay {
				t.Fatalf("settled %v (delay %v), want [%s] (delay %v)", parent.settled, parent.delay, c.want, c.wantDelay)
			}
			// A second settlement of an item changes nothing.
			if err := items[0].Ack(); !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
				t.Fatalf("second settlement: %v", err)
			}
			if len(parent.settled) != 1 {
				t.Fatalf("settled again: %v", parent.settled)
			}
		})
	}
}

// TestSplitBatch: each item keeps its own subject and body and the batch's
// headers (without the batch header); bad entries are set aside without
// holding the batch; a body that is not a batch is reported for
// termination; a message without the header is not a batch.
func TestSplitBatch(t *testing.T) {
	t.Parallel()
	good := entry(7)
	good.Subject = "aurora.outbox.x.org_9.3"
	badKey := entry(8)
	badKey.Key = "short"
	parent := batchOf(good, badKey)
	items, bad, why, ok := splitBatch(parent)
	if !ok || bad != 1 || len(items) != 1 || !errors.Is(why, outbox.ErrBadMessage) {
		t.Fatalf("split: %d items, %d bad, %v, ok %v", len(items), bad, why, ok)
	}
	m, err := outbox.DecodeMessage(items[0].Data())
	if err != nil || m != good.Message || items[0].Subject() != good.Subject {
		t.Fatalf("item: %+v %q %v", m, items[0].Subject(), err)
	}
	if h := items[0].Headers(); h.Get(outbox.HeaderBatch) != "" || h.Get(outbox.HeaderDatabase) != "db1" {
		t.Fatalf("item headers %v", h)
	}
	if len(parent.settled) != 0 {
		t.Fatal("the bad entry settled the batch while an item is open")
	}
	_ = items[0].Ack()
	if len(parent.settled) != 1 || parent.settled[0] != "ack" {
		t.Fatalf("settled %v", parent.settled)
	}

	allBad := batchOf(badKey, badKey)
	if items, bad, _, ok := splitBatch(allBad); !ok || bad != 2 || len(items) != 0 || len(allBad.settled) != 1 || allBad.settled[0] != "ack" {
		t.Fatalf("all bad: %d items, %d bad, ok %v, settled %v", len(items), bad, ok, allBad.settled)
	}
	notBatch := &recordedMsg{header: nats.Header{outbox.HeaderBatch: []string{"1"}}, data: []byte(`{"item_id":1}`)}
	if items, bad, why, ok := splitBatch(notBatch); !ok || items != nil || bad != 0 || !errors.Is(why, outbox.ErrBadMessage) {
		t.Fatalf("undecodable batch: %v %d %v %v", items, bad, why, ok)
	}
	plain := &recordedMsg{header: nats.Header{}, data: good.Message.Encode()}
	if _, _, _, ok := splitBatch(plain); ok {
		t.Fatal("a message without the batch header was split")
	}
}

// TestBatchHeartbeatsAreRateLimited: the items' InProgress reaches
// JetStream at most once per inProgressEvery.
func TestBatchHeartbeatsAreRateLimited(t *testing.T) {
	t.Parallel()
	parent := batchOf(entry(1), entry(2))
	b := &batchMsg{msg: parent, pending: 2}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, at := range []time.Duration{0, 10 * time.Millisecond, 999 * time.Millisecond, inProgressEvery, inProgressEvery + time.Millisecond, 3 * inProgressEvery} {
		_ = b.inProgress(t0.Add(at))
	}
	if parent.progress != 3 {
		t.Fatalf("%d heartbeats passed on, want 3", parent.progress)
	}
}
