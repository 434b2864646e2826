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

// claimDueSQL selects up to $2 rows that need their current dispatch
// published: due (pending with next_attempt_at <= now, or leased with an
// expired lease) and published_dispatch < dispatch. There is no cursor: a
// row whose transaction commits after a higher id's is simply due and
// unpublished when it becomes visible (Postgres hands out sequence values at
// insert, not at commit, so ids commit out of order). FOR UPDATE SKIP LOCKED: concurrent workers and
// relays take disjoint rows, and the locks, held until the marks commit,
// keep anyone else from publishing the same dispatch meanwhile.
//
// Two index-ordered scans, each stopping at its LIMIT: expired leases first
// (outbox_items_leased_expiry_idx, bounded by now, normally empty), then
// pending rows in due order (outbox_items_unpublished_idx) for the rest of
// the batch. One statement with an OR over both states was answered with a
// bitmap scan that read every unpublished row and every leased row, then
// sorted them, on every batch: a cost that grew with the backlog
// (auto_explain on the demo: 28 ms a batch).
const claimDueSQL = `
WITH expired AS MATERIALIZED (
    SELECT id, idempotency_key, exporter, tenant, dispatch, feature, destination_account
    FROM outbox_items
    WHERE state = 'leased' AND published_dispatch < dispatch
      AND lease_expires_at < coalesce($1::timestamptz, now())
    ORDER BY lease_expires_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), due AS MATERIALIZED (
    SELECT id, idempotency_key, exporter, tenant, dispatch, feature, destination_account
    FROM outbox_items
    WHERE state = 'pending' AND published_dispatch < dispatch
      AND next_attempt_at <= coalesce($1::timestamptz, now())
    ORDER BY next_attempt_at
    LIMIT greatest($2 - (SELECT count(*) FROM expired), 0)
    FOR UPDATE SKIP LOCKED
)
SELECT c.id, c.idempotency_key, c.exporter, c.tenant, c.dispatch, c.feature, c.destination_account,
       b.stripe_customer, m.meter_id
FROM (SELECT * FROM expired UNION ALL SELECT * FROM due) c
-- The lane (account, customer, meter): one key lookup each (LIMIT 1 keeps
-- them lookups).
LEFT JOIN LATERAL (
    SELECT b.stripe_customer FROM tenant_billing b
    WHERE b.tenant = c.tenant AND b.destination_account = c.destination_account LIMIT 1
) b ON true
LEFT JOIN LATERAL (
    SELECT m.meter_id FROM meter_mappings m
    WHERE m.destination_account = c.destination_account AND m.feature = c.feature LIMIT 1
) m ON true`

// markPublishedSQL records the PubAck'd dispatch of each locked row. The
// dispatch check is belt and braces: the batch holds the row locks, so no
// one can have changed it.
const markPublishedSQL = `
UPDATE outbox_items o
SET published_dispatch = p.dispatch, published_at = coalesce($3::timestamptz, now())
FROM unnest($1::bigint[], $2::int[]) AS p(id, dispatch)
WHERE o.id = p.id AND o.dispatch = p.dispatch`

// claimed is one row of a batch, with the lane it was read on.
type claimed struct {
	id       int64
	key      string
	exporter string
	tenant   string
	dispatch int32
	feature  string
	account  string
	customer *string // nil: the tenant has no Stripe customer on the account
	meter    *string // nil: the feature has no meter on the account
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
	lane := c.lane()
	return &nats.Msg{
		Subject: outbox.PartitionSubject(c.exporter, c.tenant, outbox.Partition(lane, partitions)),
		Data:    outbox.Message{ItemID: c.id, Key: c.key, Dispatch: c.dispatch, Feature: c.feature, Lane: lane}.Encode(),
		Header: nats.Header{
			jetstream.MsgIDHeader:          []string{outbox.MsgID(c.key, c.dispatch)},
			jetstream.ExpectedStreamHeader: []string{outbox.StreamName},
			outbox.HeaderDatabase:          []string{database},
		},
	}
}

// batch claims up to BatchSize due, unpublished rows in one transaction,
// publishes them asynchronously, marks the acknowledged ones and commits. It
// returns the number of rows claimed. Rows whose publish failed stay
// unpublished (their locks end with the commit); the error (the first
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

	items, err := r.claim(bctx, conn.Conn())
	if err != nil {
		return 0, err
	}
	if len(items) == 0 {
		if _, err := conn.Exec(bctx, "COMMIT"); err != nil {
			return 0, fmt.Errorf("relay: commit: %w", err)
		}
		return 0, nil
	}

	acked, pubErr := r.publish(bctx, items)

	if h := r.hooks.afterPublish; h != nil {
		if err := h(bctx, itemIDs(acked)); err != nil {
			return len(items), &fatalError{err}
		}
	}
	if err := r.markAndCommit(bctx, conn.Conn(), acked); err != nil {
		// The marks are lost, the messages are not: the rows are published
		// again with the same dispatch and JetStream drops the copies.
		return len(items), err
	}
	r.m.published.Add(float64(len(acked)))
	if h := r.hooks.afterCommit; h != nil && len(acked) > 0 {
		h(itemIDs(acked))
	}
	return len(items), pubErr
}

// claim opens the batch transaction and locks the due rows, in one round
// trip.
func (r *Relay) claim(ctx context.Context, conn *pgx.Conn) ([]claimed, error) {
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue("SET LOCAL synchronous_commit = off")
	b.Queue(claimDueSQL, r.clk.Override(), r.cfg.Outbox.BatchSize)
	br := conn.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("relay: begin: %w", err)
	}
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("relay: begin: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("relay: claim: %w", err)
	}
	items := make([]claimed, 0, r.cfg.Outbox.BatchSize)
	for rows.Next() {
		var c claimed
		if err := rows.Scan(&c.id, &c.key, &c.exporter, &c.tenant, &c.dispatch, &c.feature, &c.account, &c.customer, &c.meter); err != nil {
			rows.Close()
			return nil, fmt.Errorf("relay: claim scan: %w", err)
		}
		items = append(items, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("relay: claim: %w", err)
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("relay: claim: %w", err)
	}
	return items, nil
}

// markAndCommit records the acknowledged dispatches and commits, in one
// round trip. Every row the UPDATE marks was acknowledged for exactly that
// dispatch, so the commit is right even if fewer rows matched than were
// acknowledged; that case (impossible while the batch holds the row locks)
// is reported as ErrMarkMismatch after the commit, and the unmarked rows are
// simply published again.
func (r *Relay) markAndCommit(ctx context.Context, conn *pgx.Conn, acked []claimed) error {
	if len(acked) == 0 {
		if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
			return fmt.Errorf("relay: commit: %w", err)
		}
		return nil
	}
	ids := make([]int64, len(acked))
	dispatches := make([]int32, len(acked))
	for i, c := range acked {
		ids[i], dispatches[i] = c.id, c.dispatch
	}
	b := &pgx.Batch{}
	b.Queue(markPublishedSQL, ids, dispatches, r.clk.Override())
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, b)
	tag, err := br.Exec()
	if err != nil {
		_ = br.Close()
		return fmt.Errorf("relay: mark published: %w", err)
	}
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return fmt.Errorf("relay: commit: %w", err)
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("relay: commit: %w", err)
	}
	if tag.RowsAffected() != int64(len(acked)) {
		return fmt.Errorf("%w: %d marked, %d acknowledged", ErrMarkMismatch, tag.RowsAffected(), len(acked))
	}
	return nil
}

func itemIDs(cs []claimed) []int64 {
	ids := make([]int64, len(cs))
	for i, c := range cs {
		ids[i] = c.id
	}
	return ids
}

// publish sends every item asynchronously, at most MaxInflight unacknowledged
// across all workers, and waits for the PubAcks until the publish timeout.
// It returns the acknowledged items (a duplicate PubAck counts: JetStream
// already holds this dispatch's message) and the first error.
func (r *Relay) publish(ctx context.Context, items []claimed) ([]claimed, error) {
	type future struct {
		item claimed
		paf  jetstream.PubAckFuture
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
				if err := r.ack(ack, f.item, &acked); err != nil {
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
			if err := r.ack(ack, f.item, &acked); err != nil {
				fail(err)
			}
		case err := <-f.paf.Err():
			fail(err)
		default:
			fail(ErrPublishTimeout)
		}
	}

	for _, it := range items {
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
		paf, err := r.js.PublishMsgAsync(it.message(r.cfg.Stream.Partitions, r.cfg.Stream.Database))
		if err != nil {
			<-r.inflight
			fail(err)
			continue
		}
		futures = append(futures, future{item: it, paf: paf})
	}
	for waited < len(futures) {
		resolve()
	}
	return acked, firstErr
}

// ack records one PubAck. A PubAck from another stream cannot happen
// (Nats-Expected-Stream) but is refused rather than trusted.
func (r *Relay) ack(a *jetstream.PubAck, it claimed, acked *[]claimed) error {
	if a == nil || a.Stream != outbox.StreamName {
		return fmt.Errorf("relay: PubAck from an unexpected stream")
	}
	if a.Duplicate {
		r.m.duplicates.Inc()
	}
	*acked = append(*acked, it)
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
