package relay

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Batch messages (AURORA_RELAY_BATCH_MESSAGE_ITEMS above 1): a batch's due
// items of one exporter and partition travel in one JetStream message
// (outbox.Batch on outbox.BatchSubject) instead of one message each —
// fewer messages to store, deliver, acknowledge and remove. Only where it
// is safe: an item goes into a batch only when one partition consumer
// whose deliverers accept batches (they say so in the consumer's metadata,
// outbox.MetaBatchMessages) filters both the batch subject and the item's
// own subject, so the batch reaches the pool the item's own message would
// have. A pool of older deliverers, a tenant's own pool (its filter never
// matches the batch token) or no consumer at all: the item goes out alone,
// as before.

// batchSubjectsTTL is how long the relay trusts its reading of the
// stream's consumers before it reads them again; a reading that found no
// consumer accepting batches is retried after batchSubjectsRetry (a relay
// started before its deliverers batches once they have attached).
const (
	batchSubjectsTTL   = 10 * time.Second
	batchSubjectsRetry = time.Second
)

// batchTargets caches the filters of the consumers that accept batches.
type batchTargets struct {
	mu      sync.Mutex
	read    time.Time
	filters [][]string // per consumer that accepts batches, its filter subjects
}

// accepts reports whether one consumer that accepts batch messages filters
// both batchSubject and itemSubject (the item's own message's subject),
// reading the stream's consumers when the last reading is older than
// batchSubjectsTTL. A failed reading keeps the previous one (none at
// first: no batches) and is returned.
func (r *Relay) accepts(ctx context.Context, batchSubject, itemSubject string) (bool, error) {
	t := &r.batchTargets
	t.mu.Lock()
	defer t.mu.Unlock()
	var err error
	now := time.Now() // a local refresh interval; tests move it with the clock's override
	if o := r.clk.Override(); o != nil {
		now = *o
	}
	ttl := batchSubjectsTTL
	if len(t.filters) == 0 {
		ttl = batchSubjectsRetry
	}
	if t.read.IsZero() || now.Sub(t.read) >= ttl {
		t.read = now
		var fs [][]string
		if fs, err = r.batchFilters(ctx); err == nil {
			t.filters = fs
		}
	}
	for _, fs := range t.filters {
		if matchesAny(fs, batchSubject) && matchesAny(fs, itemSubject) {
			return true, err
		}
	}
	return false, err
}

func matchesAny(filters []string, subject string) bool {
	for _, f := range filters {
		if outbox.SubjectMatches(f, subject) {
			return true
		}
	}
	return false
}

// batchFilters lists the filter subjects of each of the stream's consumers
// that accept batch messages.
func (r *Relay) batchFilters(ctx context.Context) ([][]string, error) {
	s, err := r.js.Stream(ctx, outbox.StreamName)
	if err != nil {
		return nil, fmt.Errorf("relay: read consumers: %w", err)
	}
	var out [][]string
	l := s.ListConsumers(ctx)
	for info := range l.Info() {
		if info.Config.Metadata[outbox.MetaBatchMessages] != "1" {
			continue
		}
		fs := append([]string(nil), info.Config.FilterSubjects...)
		if info.Config.FilterSubject != "" {
			fs = append(fs, info.Config.FilterSubject)
		}
		out = append(out, fs)
	}
	if err := l.Err(); err != nil {
		return nil, fmt.Errorf("relay: read consumers: %w", err)
	}
	return out, nil
}

// unit is one JetStream message to publish and the items it carries.
type unit struct {
	msg   *nats.Msg
	items []claimed
}

// units returns the messages for items: one per item, or with
// BatchMessageItems above 1, batch messages of up to that many items (at
// most one of a lane: chunks) for the items whose batch subject and own
// subject one batch-accepting consumer filters (in the order of each
// group's first item; items keep their order inside a batch).
func (r *Relay) units(ctx context.Context, items []claimed) []unit {
	parts, db := r.cfg.Stream.Partitions, r.cfg.Stream.Database
	single := func(it claimed) unit { return unit{msg: it.message(parts, db), items: []claimed{it}} }
	out := make([]unit, 0, len(items))
	if r.cfg.BatchMessageItems <= 1 {
		for _, it := range items {
			out = append(out, single(it))
		}
		return out
	}
	type group struct {
		subject string
		items   []claimed
	}
	var groups []*group
	bySubject := map[string]*group{}
	verdict := map[[2]string]bool{}
	for _, it := range items {
		subject := outbox.BatchSubject(it.exporter, outbox.Partition(it.lane(), parts))
		key := [2]string{subject, it.subject(parts)}
		ok, seen := verdict[key]
		if !seen {
			var err error
			if ok, err = r.accepts(ctx, key[0], key[1]); err != nil {
				r.log.Warn("relay: cannot read which consumers accept batch messages; going by the last reading", "err", err)
			}
			verdict[key] = ok
		}
		if !ok {
			out = append(out, single(it))
			continue
		}
		g := bySubject[subject]
		if g == nil {
			g = &group{subject: subject}
			bySubject[subject] = g
			groups = append(groups, g)
		}
		g.items = append(g.items, it)
	}
	for _, g := range groups {
		for _, chunk := range chunks(g.items, r.cfg.BatchMessageItems) {
			if len(chunk) == 1 {
				out = append(out, single(chunk[0]))
				continue
			}
			out = append(out, unit{msg: batchMessage(g.subject, chunk, parts, db), items: chunk})
		}
	}
	return out
}

// chunks splits one partition's items into batches of at most size items
// and **at most one item of a lane each**, in order: each item goes to the
// first batch with room and none of its lane. A lane then gets no more
// items per message than with one message per item, so the deliverer's
// flow control (a pull, the ack-pending window and a lane's share, all
// counted in messages) still paces a hot lane: with whole runs of a hot
// lane in one message, its lane overflowed its share and deferred items
// back to the relay — the kill trial's staged → accepted p50 went from
// 8.5 s to 55.7 s before this rule (BENCHMARKS.md).
func chunks(items []claimed, size int) [][]claimed {
	var out [][]claimed
	var lanes []map[string]bool
	for _, it := range items {
		lane := it.lane()
		i := 0
		for ; i < len(out); i++ {
			if len(out[i]) < size && !lanes[i][lane] {
				break
			}
		}
		if i == len(out) {
			out = append(out, nil)
			lanes = append(lanes, map[string]bool{})
		}
		out[i] = append(out[i], it)
		lanes[i][lane] = true
	}
	return out
}

// batchMessage builds the batch message of items on subject: each entry
// the subject and body the item's own message would have, Nats-Msg-Id
// outbox.BatchMsgID, the outbox database and Nats-Expected-Stream as on
// every message, and outbox.HeaderBatch with the item count.
func batchMessage(subject string, items []claimed, parts int, database string) *nats.Msg {
	b := outbox.Batch{Items: make([]outbox.BatchEntry, len(items))}
	for i, it := range items {
		b.Items[i] = outbox.BatchEntry{Subject: it.subject(parts), Message: it.body()}
	}
	return &nats.Msg{
		Subject: subject,
		Data:    b.Encode(),
		Header: nats.Header{
			jetstream.MsgIDHeader:          []string{outbox.BatchMsgID(b)},
			jetstream.ExpectedStreamHeader: []string{outbox.StreamName},
			outbox.HeaderDatabase:          []string{database},
			outbox.HeaderBatch:             []string{fmt.Sprint(len(items))},
		},
	}
}
