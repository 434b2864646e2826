package gauge_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5/pgxpool"
)

// testNow is the injected clock's instant; fixtures are placed relative to it.
var testNow = time.Date(2026, 9, 15, 9, 30, 0, 0, time.UTC)

// item is one outbox row as a fixture.
type item struct {
	state   outbox.State
	reason  string        // quarantined only
	staged  time.Duration // created_at = testNow - staged
	changed time.Duration // updated_at = testNow - changed
}

var itemSeq int

// insertItems writes rows straight into outbox_items in the given states
// (the gauges read states; how rows got there is other packages' tests).
func insertItems(t *testing.T, pool *pgxpool.Pool, items ...item) {
	t.Helper()
	for _, it := range items {
		itemSeq++
		var reason *string
		if it.reason != "" {
			reason = &it.reason
		}
		var lease *time.Time
		if it.state == outbox.StateLeased {
			l := testNow.Add(time.Minute)
			lease = &l
		}
		_, err := pool.Exec(context.Background(), `
			INSERT INTO outbox_items (tenant, subject_kind, subject_ref, exporter, destination_account, mode, mapping_version,
				idempotency_key, feature, quantity, occurred_at, period_start, state, quarantine_reason, lease_expires_at,
				created_at, updated_at)
			VALUES ('tn_gauge', 'event', $1, 'stripe_meter_events', 'acct_1Test', 'test', 1, '', 'api_calls', 1, $2, $2,
				$3, $4, $5, $6, $7)`,
			fmt.Sprintf("event:g%d", itemSeq), testNow.Add(-time.Hour), string(it.state), reason, lease,
			testNow.Add(-it.staged), testNow.Add(-it.changed))
		if err != nil {
			t.Fatalf("insert %+v: %v", it, err)
		}
	}
}

// event is one billing_events row as a fixture.
type event struct {
	received time.Duration // received_at = testNow - received
	attempts int
	dead     string // dead-lettered with this last_reason
	done     bool   // processed
}

func insertEvents(t *testing.T, pool *pgxpool.Pool, events ...event) {
	t.Helper()
	for _, e := range events {
		itemSeq++
		body := []byte(fmt.Sprintf(`{"id":"evt_g%d"}`, itemSeq))
		sum := sha256.Sum256(body)
		var dead, done *time.Time
		var reason *string
		if e.dead != "" {
			dead, reason = &testNow, &e.dead
		}
		if e.done {
			done = &testNow
		}
		_, err := pool.Exec(context.Background(), `
			INSERT INTO billing_events (event_id, event_type, payload, payload_sha256, received_at, attempts, last_reason,
				dead_letter_at, processed_at)
			VALUES ($1, 'invoice.paid', $2, $3, $4, $5, $6, $7, $8)`,
			fmt.Sprintf("evt_g%d", itemSeq), body, sum[:], testNow.Add(-e.received), e.attempts, reason, dead, done)
		if err != nil {
			t.Fatalf("insert %+v: %v", e, err)
		}
	}
}

// proxy forwards TCP connections to target until cut, which closes the
// listener and every forwarded connection: to the code under test the
// database is gone, as when Postgres stops.
type proxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	cut   bool
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			if p.cut {
				c.Close()
				up.Close()
			} else {
				p.conns = append(p.conns, c, up)
			}
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	t.Cleanup(p.Cut)
	return p
}

func (p *proxy) Addr() string { return p.ln.Addr().String() }

// Cut stops forwarding: the listener closes (new connections are refused)
// and open connections drop.
func (p *proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	p.ln.Close()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// finding is one reconciliation_items row as a fixture.
type finding struct {
	kind     string
	seen     time.Duration // first_seen_at = testNow - seen
	resolved bool
}

func insertFindings(t *testing.T, pool *pgxpool.Pool, fs ...finding) {
	t.Helper()
	for _, f := range fs {
		itemSeq++
		var err error
		if f.resolved {
			_, err = pool.Exec(context.Background(), `
				INSERT INTO reconciliation_items (kind, fingerprint, detail, first_seen_at, state, resolution, resolved_by, resolved_at)
				VALUES ($1, $2, 'fixture', $3, 'resolved', 'looked at it', 'test', $3)`,
				f.kind, fmt.Sprintf("fp%d", itemSeq), testNow.Add(-f.seen))
		} else {
			_, err = pool.Exec(context.Background(), `
				INSERT INTO reconciliation_items (kind, fingerprint, detail, first_seen_at) VALUES ($1, $2, 'fixture', $3)`,
				f.kind, fmt.Sprintf("fp%d", itemSeq), testNow.Add(-f.seen))
		}
		if err != nil {
			t.Fatalf("insert %+v: %v", f, err)
		}
	}
}

// domainEvent is one event_outbox row as a fixture, with the consumers'
// inbox rows for it.
type domainEvent struct {
	eventType  string
	status     string        // event_outbox.status
	created    time.Duration // created_at = testNow - created
	dispatched time.Duration // dispatched_at = testNow - dispatched (dispatched, acknowledged)
	processed  []string      // consumers with a processed inbox row
	dead       []string      // consumers that dead-lettered it
}

// insertDomainEvents registers consumers (name → types) and writes events
// with their inbox rows straight into the tables (the gauges read rows;
// how rows got there is shared/events' tests).
func insertDomainEvents(t *testing.T, pool *pgxpool.Pool, consumers map[string][]string, events ...domainEvent) {
	t.Helper()
	ctx := context.Background()
	for name, types := range consumers {
		if _, err := pool.Exec(ctx, `INSERT INTO event_consumers (consumer, event_types) VALUES ($1, $2)`, name, types); err != nil {
			t.Fatalf("register %s: %v", name, err)
		}
	}
	for _, e := range events {
		itemSeq++
		var dispatched, acked, dead *time.Time
		if e.status == "dispatched" || e.status == "acknowledged" {
			d := testNow.Add(-e.dispatched)
			dispatched = &d
		}
		if e.status == "acknowledged" {
			acked = &testNow
		}
		if e.status == "dead_letter" {
			dead = &testNow
		}
		var id string
		err := pool.QueryRow(ctx, `
			INSERT INTO event_outbox (event_type, aggregate_id, payload, status, created_at, dispatched_at, acknowledged_at, dead_lettered_at)
			VALUES ($1, $2, '{}', $3, $4, $5, $6, $7) RETURNING event_id::text`,
			e.eventType, fmt.Sprintf("agg%d", itemSeq), e.status, testNow.Add(-e.created), dispatched, acked, dead).Scan(&id)
		if err != nil {
			t.Fatalf("insert %+v: %v", e, err)
		}
		for _, c := range e.processed {
			if _, err := pool.Exec(ctx, `INSERT INTO event_inbox (consumer, event_id, status, processed_at) VALUES ($1, $2, 'processed', $3)`,
				c, id, testNow); err != nil {
				t.Fatalf("inbox %s: %v", c, err)
			}
		}
		for _, c := range e.dead {
			if _, err := pool.Exec(ctx, `INSERT INTO event_inbox (consumer, event_id, status, attempts, dead_lettered_at, dead_letter_reason)
				VALUES ($1, $2, 'failed', 5, $3, 'handler_failed')`, c, id, testNow); err != nil {
				t.Fatalf("inbox dead %s: %v", c, err)
			}
		}
	}
}
