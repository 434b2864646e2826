package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// claimDueSQL takes up to $2 due wake-up calls from outbox_publish_queue
// (migration 00308: triggers queue one row per dispatch to publish, at
// staging and whenever a dispatch moves) and returns the items still worth
// publishing, oldest due first. The queue rows are deleted in the batch's
// transaction (FOR UPDATE SKIP LOCKED, so concurrent workers and relays
// take disjoint rows): a batch that rolls back, or a relay that dies,
// leaves them queued.
//
// Each taken row is judged against its item, by the database clock (or $1):
//   - due: the item is still at that dispatch, unpublished for it, and
//     pending with next_attempt_at <= now or leased with an expired lease.
//     Returned, at most once per item.
//   - later: the same, but not due yet (a lease still live, a due time
//     moved later). Queued again at the item's own due time.
//   - gone: the item moved on (another dispatch, already published, a
//     terminal state). Dropped; a new dispatch has a queue row of its own.
//
// There is no cursor over outbox_items: a row whose transaction commits
// after a higher id's simply has its queue row appear at commit.
const claimDueSQL = `
WITH clk AS (SELECT coalesce($1::timestamptz, now()) AS now),
taken AS (
    DELETE FROM outbox_publish_queue
    WHERE ctid = ANY (ARRAY(
        SELECT q.ctid FROM outbox_publish_queue q
        WHERE q.due_at <= (SELECT now FROM clk)
        ORDER BY q.due_at
        LIMIT $2
        FOR UPDATE SKIP LOCKED))
    RETURNING item_id, dispatch, due_at
),
judged AS MATERIALIZED (
    SELECT t.item_id, t.dispatch, t.due_at AS queued_at, o.idempotency_key, o.exporter, o.tenant, o.feature,
           o.destination_account,
           CASE WHEN o.state = 'leased' THEN o.lease_expires_at ELSE o.next_attempt_at END AS due_at,
           CASE
               WHEN o.id IS NULL OR o.dispatch <> t.dispatch OR o.published_dispatch >= o.dispatch
                    OR o.state NOT IN ('pending', 'leased') THEN 'gone'
               WHEN o.state = 'pending' AND o.next_attempt_at > clk.now THEN 'later'
               WHEN o.state = 'leased' AND o.lease_expires_at >= clk.now THEN 'later'
               ELSE 'due'
           END AS verdict
    FROM taken t CROSS JOIN clk
    LEFT JOIN outbox_items o ON o.id = t.item_id
),
requeued AS (
    INSERT INTO outbox_publish_queue (item_id, dispatch, due_at)
    SELECT DISTINCT item_id, dispatch, due_at FROM judged WHERE verdict = 'later'
)
-- One row at least: the count of queue rows taken, with the due items
-- (none: NULLs) beside it.
SELECT n.taken, c.item_id, c.idempotency_key, c.exporter, c.tenant, c.dispatch, c.feature, c.destination_account,
       c.queued_at, c.stripe_customer, c.meter_id
FROM (SELECT count(*) AS taken FROM taken) n
LEFT JOIN (
    SELECT c.*, b.stripe_customer, m.meter_id
    FROM (SELECT DISTINCT ON (item_id) * FROM judged WHERE verdict = 'due' ORDER BY item_id, queued_at) c
    -- The lane (account, customer, meter): one key lookup each (LIMIT 1
    -- keeps them lookups).
    LEFT JOIN LATERAL (
        SELECT b.stripe_customer FROM tenant_billing b
        WHERE b.tenant = c.tenant AND b.destination_account = c.destination_account LIMIT 1
    ) b ON true
    LEFT JOIN LATERAL (
        SELECT m.meter_id FROM meter_mappings m
        WHERE m.destination_account = c.destination_account AND m.feature = c.feature LIMIT 1
    ) m ON true
) c ON true
ORDER BY c.due_at, c.item_id`

// markPublishedSQL records the PubAck'd dispatch of each row that is still
// at it, and never waits for a row lock. The batch holds no lock on the
// items, so a deliverer may be claiming or recording one of them (its
// message arrived before the mark): waiting for that row while the
// deliverer's multi-row statement waits for another row of this one would
// deadlock (Postgres cancels one of the two). The rows are locked FOR NO
// KEY UPDATE SKIP LOCKED instead; a row locked by someone else is queued
// again, due now, for the next batch to judge (published then only if it
// is still unpublished and due: a pending row whose claim failed, or a
// leased row whose holder died and whose lease expired; a row that moved
// on is dropped). A row whose dispatch moved on meanwhile is left alone:
// its new dispatch is queued, and the message of the old one is
// acknowledged by the deliverer that receives it. The update touches only
// published_dispatch and published_at, which no index reads, and keeps
// updated_at (migration 00308): a heap-only update.
//
// Returns the rows marked and the rows queued again for a lock.
const markPublishedSQL = `
WITH p AS (SELECT * FROM unnest($1::bigint[], $2::int[]) AS p(id, dispatch)),
locked AS MATERIALIZED (
    SELECT o.id, p.dispatch FROM p JOIN outbox_items o ON o.id = p.id
    FOR NO KEY UPDATE OF o SKIP LOCKED
),
-- Joined on the locked rows alone (one primary-key probe each): a second
-- join of p against locked was planned as a nested loop over both, n² for
-- a batch of n.
marked AS (
    UPDATE outbox_items o SET published_dispatch = l.dispatch, published_at = coalesce($3::timestamptz, now())
    FROM locked l
    WHERE o.id = l.id AND o.dispatch = l.dispatch AND o.published_dispatch < l.dispatch
    RETURNING o.id
),
busy AS (
    INSERT INTO outbox_publish_queue (item_id, dispatch, due_at)
    SELECT p.id, p.dispatch, coalesce($3::timestamptz, now()) FROM p
    WHERE p.id NOT IN (SELECT id FROM locked)
    RETURNING item_id
)
SELECT (SELECT count(*) FROM marked), (SELECT count(*) FROM busy)`

// requeueSQL puts back the queue rows of items whose publish failed, at
// their old due time: the next batch takes them again.
const requeueSQL = `
INSERT INTO outbox_publish_queue (item_id, dispatch, due_at)
SELECT * FROM unnest($1::bigint[], $2::int[], $3::timestamptz[])`

// claimed is one row of a batch, with the lane it was read on.
type claimed struct {
	id       int64
	key      string
	exporter string
	tenant   string
	dispatch int32
	feature  string
	account  string
	queued   time.Time // the due time its queue row carried
	customer *string   // nil: the tenant has no Stripe customer on the account
	meter    *string   // nil: the feature has no meter on the account
}

// lane returns the row's lane token (outbox.Lane of account, customer,
// meter; outbox.UnmappedLane while either is unknown).
func (c claimed) lane() string {
	if c.customer == nil || c.meter == nil {
		return outbox.UnmappedLane(c.account, c.tenant, c.feature)
	}
	return outbox.Lane(c.account, *c.customer, *c.meter)
}

// message builds the row's JetStream message: subject
// aurora.outbox.<exporter>.<tenant-token>.<partition of its lane>,
// Nats-Msg-Id key.dispatch, the outbox.Message body (feature and lane as
// the deliverers' routing hints), the outbox database's identity
// (outbox.HeaderDatabase: a deliverer of another database leaves the
// message alone), and Nats-Expected-Stream so a stray stream capturing the
// subject is refused rather than fed.
func (c claimed) message(partitions int, database string) *nats.Msg {
	return &nats.Msg{
		Subject: c.subject(partitions),
		Data:    c.body().Encode(),
		Header: nats.Header{
			jetstream.MsgIDHeader:          []string{outbox.MsgID(c.key, c.dispatch)},
			jetstream.ExpectedStreamHeader: []string{outbox.StreamName},
			outbox.HeaderDatabase:          []string{database},
		},
	}
}

// subject is the row's own message subject:
// aurora.outbox.<exporter>.<tenant-token>.<partition of its lane>.
func (c claimed) subject(partitions int) string {
	return outbox.PartitionSubject(c.exporter, c.tenant, outbox.Partition(c.lane(), partitions))
}

// body is the row's outbox.Message (feature and lane as routing hints).
func (c claimed) body() outbox.Message {
	return outbox.Message{ItemID: c.id, Key: c.key, Dispatch: c.dispatch, Feature: c.feature, Lane: c.lane()}
}

// batch takes up to BatchSize due rows of the publish queue in one
// transaction (claimDueSQL), publishes the items still due, marks the
// acknowledged ones, queues the rest again and commits. It returns the
// number of queue rows taken: a full take means more may be waiting, even
// when none of it was due (the worker goes on at once). The error (the first
// publish error, or a database error) makes the worker back off. A graceful
// stop lets a started batch finish: it runs on a context detached from ctx's
// cancellation, bounded by the publish timeout plus 10 s for the database.
//
// Two round trips to Postgres per batch: BEGIN + SET LOCAL + claim
// pipelined, then mark + COMMIT pipelined. The transaction commits with
// synchronous_commit = off: a mark lost to a Postgres crash only means the
// row is published again with the same dispatch, which JetStream drops
// (within the duplicate window) and a deliverer's claim absorbs (after it).
func (r *Relay) batch(ctx context.Context) (n int, err error) {
	if s := r.js.Conn().Status(); s != nats.CONNECTED {
		// Don't lock rows only to fill the reconnect buffer with copies.
		return 0, fmt.Errorf("%w (%s)", ErrNATSUnavailable, s)
	}
	if r.streamMissing.Load() {
		if _, err := EnsureStream(ctx, r.js, r.cfg.Stream); err != nil {
			if errors.Is(err, ErrForeignStream) {
				return 0, &fatalError{err}
			}
			return 0, err
		}
		r.streamMissing.Store(false)
	}
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.publishTimeout()+10*time.Second)
	defer cancel()
	conn, err := r.pool.Acquire(bctx)
	if err != nil {
		return 0, fmt.Errorf("relay: acquire: %w", err)
	}
	defer func() {
		if conn.Conn().PgConn().TxStatus() != 'I' {
			// Unfinished transaction: roll back; a connection that cannot is
			// closed so the pool never hands it out mid-transaction.
			if _, rerr := conn.Exec(bctx, "ROLLBACK"); rerr != nil {
				_ = conn.Conn().Close(bctx)
			}
		}
		conn.Release()
	}()

	items, taken, err := r.claim(bctx, conn.Conn())
	if err != nil {
		return 0, err
	}
	if len(items) == 0 {
		if _, err := conn.Exec(bctx, "COMMIT"); err != nil {
			return 0, fmt.Errorf("relay: commit: %w", err)
		}
		return taken, nil
	}

	acked, pubErr := r.publish(bctx, items)

	if h := r.hooks.afterPublish; h != nil {
		if err := h(bctx, itemIDs(acked)); err != nil {
			return taken, &fatalError{err}
		}
	}
	moved, locked, err := r.markAndCommit(bctx, conn.Conn(), items, acked)
	if err != nil {
		// The marks are lost, the messages are not: the rollback queues the
		// rows again, they are published again with the same dispatch and
		// JetStream drops the copies.
		return taken, err
	}
	r.m.published.Add(float64(len(acked)))
	r.m.marksSkipped.WithLabelValues(skipMoved).Add(float64(moved))
	r.m.marksSkipped.WithLabelValues(skipLocked).Add(float64(locked))
	if h := r.hooks.afterCommit; h != nil && len(acked) > 0 {
		h(itemIDs(acked))
	}
	return taken, pubErr
}

// claim opens the batch transaction and takes the due queue rows, in one
// round trip. It returns the items to publish and how many queue rows it
// took (a full take means more may be waiting, whatever it yielded).
func (r *Relay) claim(ctx context.Context, conn *pgx.Conn) ([]claimed, int, error) {
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue("SET LOCAL synchronous_commit = off")
	b.Queue(claimDueSQL, r.clk.Override(), r.cfg.Outbox.BatchSize)
	br := conn.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, 0, fmt.Errorf("relay: begin: %w", err)
	}
	if _, err := br.Exec(); err != nil {
		return nil, 0, fmt.Errorf("relay: begin: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, 0, fmt.Errorf("relay: claim: %w", err)
	}
	items := make([]claimed, 0, r.cfg.Outbox.BatchSize)
	taken := 0
	for rows.Next() {
		var (
			n                                       int64
			id                                      *int64
			key, exporter, tenant, feature, account *string
			dispatch                                *int32
			queued                                  *time.Time
			c                                       claimed
		)
		if err := rows.Scan(&n, &id, &key, &exporter, &tenant, &dispatch, &feature, &account, &queued, &c.customer, &c.meter); err != nil {
			rows.Close()
			return nil, 0, fmt.Errorf("relay: claim scan: %w", err)
		}
		taken = int(n)
		if id == nil {
			continue // nothing due among the rows taken
		}
		c.id, c.key, c.exporter, c.tenant, c.dispatch = *id, *key, *exporter, *tenant, *dispatch
		c.feature, c.account, c.queued = *feature, *account, *queued
		items = append(items, c)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("relay: claim: %w", err)
	}
	if err := br.Close(); err != nil {
		return nil, 0, fmt.Errorf("relay: claim: %w", err)
	}
	return items, taken, nil
}

// markAndCommit records the acknowledged dispatches, puts the queue rows of
// the rest of the batch back (their publish failed or timed out) and
// commits, in one round trip. It returns, of the acknowledged rows, how many
// had moved to another dispatch and how many were locked by someone else
// and queued again (markPublishedSQL), for aurora_relay_marks_skipped_total.
func (r *Relay) markAndCommit(ctx context.Context, conn *pgx.Conn, items, acked []claimed) (moved, locked int, err error) {
	b := &pgx.Batch{}
	if len(acked) > 0 {
		ids, dispatches := itemDispatches(acked)
		b.Queue(markPublishedSQL, ids, dispatches, r.clk.Override())
	}
	if failed := unacked(items, acked); len(failed) > 0 {
		ids, dispatches := itemDispatches(failed)
		dues := make([]time.Time, len(failed))
		for i, c := range failed {
			dues[i] = c.queued
		}
		b.Queue(requeueSQL, ids, dispatches, dues)
	}
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, b)
	next := 0 // the next result of the batch to read
	if len(acked) > 0 {
		var marked, busy int64
		if err := br.QueryRow().Scan(&marked, &busy); err != nil {
			_ = br.Close()
			return 0, 0, fmt.Errorf("relay: mark published: %w", err)
		}
		locked = int(busy)
		moved = len(acked) - int(marked) - locked
		next = 1
	}
	for i := next; i < b.Len(); i++ {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return 0, 0, fmt.Errorf("relay: requeue and commit: %w", err)
		}
	}
	if err := br.Close(); err != nil {
		return 0, 0, fmt.Errorf("relay: commit: %w", err)
	}
	return moved, locked, nil
}

// itemDispatches returns the ids and dispatches of cs, in order.
func itemDispatches(cs []claimed) ([]int64, []int32) {
	ids, dispatches := make([]int64, len(cs)), make([]int32, len(cs))
	for i, c := range cs {
		ids[i], dispatches[i] = c.id, c.dispatch
	}
	return ids, dispatches
}

// unacked returns the items of a batch whose publish was not acknowledged
// (acked is a subsequence of items, in the same order).
func unacked(items, acked []claimed) []claimed {
	var out []claimed
	j := 0
	for _, c := range items {
		if j < len(acked) && acked[j].id == c.id {
			j++
			continue
		}
		out = append(out, c)
	}
	return out
}

func itemIDs(cs []claimed) []int64 {
	ids := make([]int64, len(cs))
	for i, c := range cs {
		ids[i] = c.id
	}
	return ids
}

// publish sends every item asynchronously — one message each, or batch
// messages where AURORA_RELAY_BATCH_MESSAGE_ITEMS and the consumers allow
// (batchmsg.go) — at most MaxInflight messages unacknowledged across all
// workers, and waits for the PubAcks until the publish timeout.
// It returns the acknowledged items (a duplicate PubAck counts: JetStream
// already holds this dispatch's message) and the first error.
func (r *Relay) publish(ctx context.Context, items []claimed) ([]claimed, error) {
	type future struct {
		items []claimed // what the message carries: one item, or a batch's
		paf   jetstream.PubAckFuture
	}
	futures := make([]future, 0, len(items))
	acked := make([]claimed, 0, len(items))
	var firstErr error
	fail := func(err error) {
		r.m.publishErrors.WithLabelValues(errKind(err)).Inc()
		if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
			r.streamMissing.Store(true)
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	// The messages first: reading which consumers accept batches (at most
	// every few seconds) must not eat the PubAck wait.
	units := r.units(ctx, items)
	timer := time.NewTimer(r.cfg.publishTimeout())
	defer timer.Stop()
	expired := false
	waited := 0
	// resolve waits for futures[waited] and frees its in-flight slot.
	resolve := func() {
		f := futures[waited]
		waited++
		defer func() { <-r.inflight }()
		if !expired {
			select {
			case ack := <-f.paf.Ok():
				if err := r.ack(ack, f.items, &acked); err != nil {
					fail(err)
				}
				return
			case err := <-f.paf.Err():
				fail(err)
				return
			case <-timer.C:
				expired = true
			}
		}
		select { // past the deadline: take what has arrived
		case ack := <-f.paf.Ok():
			if err := r.ack(ack, f.items, &acked); err != nil {
				fail(err)
			}
		case err := <-f.paf.Err():
			fail(err)
		default:
			fail(ErrPublishTimeout)
		}
	}

	for _, u := range units {
		// Take an in-flight slot. While none is free, settle our own oldest
		// future first (so two workers never wait on each other), then wait
		// for a peer to free one.
		for acquired := false; !acquired; {
			select {
			case r.inflight <- struct{}{}:
				acquired = true
				continue
			default:
			}
			if waited < len(futures) {
				resolve()
				continue
			}
			select {
			case r.inflight <- struct{}{}:
				acquired = true
			case <-ctx.Done():
				fail(ctx.Err())
				for waited < len(futures) {
					resolve()
				}
				return acked, firstErr
			}
		}
		paf, err := r.js.PublishMsgAsync(u.msg)
		if err != nil {
			<-r.inflight
			fail(err)
			continue
		}
		futures = append(futures, future{items: u.items, paf: paf})
	}
	for waited < len(futures) {
		resolve()
	}
	return acked, firstErr
}

// ack records one PubAck: every item of its message is published. A PubAck
// from another stream cannot happen (Nats-Expected-Stream) but is refused
// rather than trusted.
func (r *Relay) ack(a *jetstream.PubAck, items []claimed, acked *[]claimed) error {
	if a == nil || a.Stream != outbox.StreamName {
		return fmt.Errorf("relay: PubAck from an unexpected stream")
	}
	if a.Duplicate {
		r.m.duplicates.Inc()
	}
	if len(items) > 1 {
		r.m.batchMessages.Inc()
	}
	*acked = append(*acked, items...)
	return nil
}

func errKind(err error) string {
	switch {
	case errors.Is(err, ErrPublishTimeout), errors.Is(err, jetstream.ErrAsyncPublishTimeout), errors.Is(err, context.DeadlineExceeded):
		return errKindTimeout
	case errors.Is(err, nats.ErrDisconnected), errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrConnectionReconnecting), errors.Is(err, nats.ErrReconnectBufExceeded):
		return errKindDisconnected
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		return errKindNoStream
	default:
		return errKindOther
	}
}
