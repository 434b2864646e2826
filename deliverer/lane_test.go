package deliverer

import (
	"testing"

	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/nats-io/nats.go/jetstream"
)

type laneMsg struct {
	jetstream.Msg // nil: only Subject and Data are used by lanes
	subject       string
	data          []byte
}

func (m laneMsg) Subject() string { return m.subject }
func (m laneMsg) Data() []byte    { return m.data }

func msgFor(tenant, feature string, item int64) laneMsg {
	return laneMsg{subject: outbox.Subject(outbox.DefaultExporter, tenant),
		data: outbox.Message{ItemID: item, Key: "k", Dispatch: 1, Feature: feature}.Encode()}
}

func TestLanes(t *testing.T) {
	t.Parallel()
	l := newLanes()
	beats := 0
	beat := func(jetstream.Msg) func() { beats++; return func() { beats-- } }
	join := func(m laneMsg) laneMode {
		key, item := laneKey(m)
		return l.join(key, item, m, beat)
	}
	a1, a2, a3 := msgFor("org_a", "api_calls", 1), msgFor("org_a", "api_calls", 2), msgFor("org_a", "api_calls", 3)
	b1 := msgFor("org_a", "egress_bytes", 4)
	tests := []struct {
		name string
		msg  laneMsg
		want laneMode
	}{
		{"first message owns the lane", a1, laneOwner},
		{"same tenant and feature queues", a2, laneQueued},
		{"other feature of the tenant is another lane", b1, laneOwner},
		{"the running item again bypasses (a re-dispatch must not wait for itself)", msgFor("org_a", "api_calls", 1), laneBypass},
		{"a queued item again bypasses", msgFor("org_a", "api_calls", 2), laneBypass},
		{"another item queues", a3, laneQueued},
	}
	for _, tt := range tests {
		if got := join(tt.msg); got != tt.want {
			t.Fatalf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
	if beats != 2 {
		t.Fatalf("queued messages heartbeating: %d, want 2", beats)
	}
	key, _ := laneKey(a1)
	if m := l.next(key); m.(laneMsg).data == nil || string(m.Data()) != string(a2.data) {
		t.Fatal("next is not FIFO")
	}
	if got := join(msgFor("org_a", "api_calls", 2)); got != laneBypass {
		t.Fatal("the new running item must bypass")
	}
	rest := l.drain(key)
	if len(rest) != 1 || beats != 0 {
		t.Fatalf("drain returned %d, %d still beating", len(rest), beats)
	}
	if l.next(key) != nil {
		t.Fatal("drained lane still open")
	}
	if got := join(a1); got != laneOwner {
		t.Fatal("a closed lane must be reopened by the next message")
	}
}
