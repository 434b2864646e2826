package gauge

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/aurora-billing/aurora/inbox"
	"github.com/aurora-billing/aurora/reconciler"
	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5"
)

// Beginner opens the read-only transaction a measurement runs in;
// *pgxpool.Pool and *pgx.Conn satisfy it.
type Beginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Reader measures Snapshots. It is safe for concurrent use.
type Reader struct {
	db  Beginner
	cfg Config
	clk clock.Clock
	// now is the process clock, used only to decide whether a cached
	// Snapshot is still fresh (never for a figure).
	now func() time.Time

	mu     sync.Mutex
	last   Snapshot
	lastAt time.Time
	have   bool
}

// Option configures a Reader.
type Option func(*Reader)

// WithClock measures ages against c instead of the database's now() (tests
// use clock.Manual). nil means the database clock.
func WithClock(c clock.Clock) Option { return func(r *Reader) { r.clk = clock.Or(c) } }

// NewReader returns a Reader over db. cfg must be valid (Config.Validate).
func NewReader(db Beginner, cfg Config, opts ...Option) (*Reader, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Reader{db: db, cfg: cfg, clk: clock.DB{}, now: time.Now}
	for _, o := range opts {
		o(r)
	}
	return r, nil
}

// Cached returns the last Snapshot if it is younger than
// Config.MinIntervalMS, else measures a new one. Failures are not cached:
// the next call queries again.
func (r *Reader) Cached(ctx context.Context) (Snapshot, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.have && r.now().Sub(r.lastAt) < r.cfg.minInterval() {
		return r.last, nil
	}
	s, err := r.Read(ctx)
	if err != nil {
		return Snapshot{}, err
	}
	r.last, r.lastAt, r.have = s, r.now(), true
	return s, nil
}

// Read measures every figure now, in one read-only transaction whose
// statements each run under statement_timeout = Config.QueryTimeoutMS, the
// whole measurement bounded by the same deadline. Any failure is ErrQuery
// wrapping the cause and naming the figure; no partial Snapshot is returned.
func (r *Reader) Read(ctx context.Context) (Snapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.queryTimeout())
	defer cancel()
	tx, err := r.db.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return Snapshot{}, fmt.Errorf("%w: begin: %w", ErrQuery, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read-only; nothing to keep
	if _, err := tx.Exec(ctx, sqlSetTimeout, strconv.Itoa(r.cfg.QueryTimeoutMS)); err != nil {
		return Snapshot{}, fmt.Errorf("%w: statement_timeout: %w", ErrQuery, err)
	}
	s := Snapshot{CountCap: r.cfg.CountCap}
	steps := []struct {
		figure string
		fn     func(context.Context, pgx.Tx, *Snapshot) error
	}{
		{"outbox backlog age", r.outboxAges},
		{"outbox item counts", r.outboxCounts},
		{"outbox quarantine by reason", r.outboxQuarantine},
		{"inbox", r.inboxFigures},
		{"inbox dead letters", r.inboxDeadLetters},
		{"reconciliation items", r.reconciliation},
		{"domain events", r.eventFigures},
		{"domain event consumers", r.eventConsumers},
	}
	for _, st := range steps {
		if err := st.fn(ctx, tx, &s); err != nil {
			return Snapshot{}, fmt.Errorf("%w: %s: %w", ErrQuery, st.figure, err)
		}
	}
	return s, nil
}

// sqlSetTimeout applies to this transaction only.
const sqlSetTimeout = `SELECT set_config('statement_timeout', $1, true)`

// outboxAgesParams are the parameters of sqlOutboxAges.
type outboxAgesParams struct {
	Now *time.Time // nil: the database's now()
}

// sqlOutboxAges: outbox_items has no index on state (migration 00311: the
// deliverer's claim and outcome stay heap-only updates), so each age reads
// an index whose column no claim or outcome moves:
//   - pending, leased: outbox_undecided_created_idx (outbox_undecided, the
//     pending and leased items plus those that left since the relay's last
//     trim, by the item's created_at), the first row whose item is in the
//     state.
//   - accepted: outbox_items_unfinished_created_idx (created_at, items not
//     yet confirmed, rejected or quarantined), the first accepted one. The
//     walk passes the unfinished items older than it that are not accepted
//     (pending, leased, uncertain): normally few, but in a backlog of old
//     pending items with nothing accepted it reads all of them.
//   - uncertain: outbox_items_uncertain_since_idx, one probe.
const sqlOutboxAges = `
SELECT n.now,
       greatest(0, coalesce(extract(epoch FROM n.now - (SELECT u.created_at FROM outbox_undecided u
           JOIN outbox_items o ON o.id = u.item_id WHERE o.state = 'pending' ORDER BY u.created_at LIMIT 1)), 0))::float8,
       greatest(0, coalesce(extract(epoch FROM n.now - (SELECT u.created_at FROM outbox_undecided u
           JOIN outbox_items o ON o.id = u.item_id WHERE o.state = 'leased' ORDER BY u.created_at LIMIT 1)), 0))::float8,
       greatest(0, coalesce(extract(epoch FROM n.now - (SELECT created_at FROM outbox_items
           WHERE NOT finished AND state = 'accepted' ORDER BY created_at LIMIT 1)), 0))::float8,
       greatest(0, coalesce(extract(epoch FROM n.now - (SELECT min(uncertain_since) FROM outbox_items
           WHERE uncertain_since IS NOT NULL)), 0))::float8,
       (SELECT coalesce(max(id), 0) FROM outbox_items)
  FROM (SELECT coalesce(@now::timestamptz, now()) AS now) n`

func (r *Reader) outboxAges(ctx context.Context, tx pgx.Tx, s *Snapshot) error {
	p := outboxAgesParams{Now: r.clk.Override()}
	var pending, leased, accepted float64
	err := tx.QueryRow(ctx, sqlOutboxAges, pgx.NamedArgs{"now": p.Now}).Scan(
		&s.MeasuredAt, &pending, &leased, &accepted, &s.Outbox.UncertainOldestAgeSeconds, &s.Outbox.LastItemID)
	if err != nil {
		return err
	}
	s.MeasuredAt = s.MeasuredAt.UTC()
	s.Outbox.BacklogAgeSeconds = map[outbox.State]float64{
		outbox.StatePending: pending, outbox.StateLeased: leased, outbox.StateAccepted: accepted,
	}
	return nil
}

// countParams are the parameters of the capped counts.
type countParams struct {
	Cap int // the most rows one count reads
}

// sqlOutboxCounts: each count reads at most @cap entries of an index no
// claim or outcome moves (migration 00311): outbox_undecided for pending and
// leased (joined to the item for its state), outbox_items_uncertain_since_idx,
// outbox_items_quarantine_reason_idx (the reason is set exactly while an
// item is quarantined).
const sqlOutboxCounts = `
SELECT (SELECT count(*) FROM (SELECT 1 FROM outbox_undecided u JOIN outbox_items o ON o.id = u.item_id
                              WHERE o.state = 'pending' LIMIT @cap) c),
       (SELECT count(*) FROM (SELECT 1 FROM outbox_undecided u JOIN outbox_items o ON o.id = u.item_id
                              WHERE o.state = 'leased' LIMIT @cap) c),
       (SELECT count(*) FROM (SELECT 1 FROM outbox_items WHERE uncertain_since IS NOT NULL LIMIT @cap) c),
       (SELECT count(*) FROM (SELECT 1 FROM outbox_items WHERE quarantine_reason IS NOT NULL LIMIT @cap) c)`

func (r *Reader) outboxCounts(ctx context.Context, tx pgx.Tx, s *Snapshot) error {
	p := countParams{Cap: r.cfg.CountCap}
	var pending, leased, uncertain, quarantined int64
	if err := tx.QueryRow(ctx, sqlOutboxCounts, pgx.NamedArgs{"cap": p.Cap}).Scan(&pending, &leased, &uncertain, &quarantined); err != nil {
		return err
	}
	s.Outbox.Items = map[outbox.State]int64{
		outbox.StatePending: pending, outbox.StateLeased: leased,
		outbox.StateUncertain: uncertain, outbox.StateQuarantined: quarantined,
	}
	return nil
}

// reasonCountParams are the parameters of the per-reason capped counts.
type reasonCountParams struct {
	Cap     int
	Reasons []string // the known reasons; anything else counts as ReasonOther
}

// sqlOutboxQuarantine: one capped probe of outbox_items_quarantine_reason_idx
// (migration 00311) per known reason, and one for the rest.
const sqlOutboxQuarantine = `
SELECT r.reason,
       (SELECT count(*) FROM (SELECT 1 FROM outbox_items
                               WHERE quarantine_reason IS NOT NULL AND quarantine_reason = r.reason LIMIT @cap) c)
  FROM unnest(@reasons::text[]) AS r(reason)
UNION ALL
SELECT '` + ReasonOther + `',
       (SELECT count(*) FROM (SELECT 1 FROM outbox_items
                               WHERE quarantine_reason IS NOT NULL AND quarantine_reason <> ALL(@reasons::text[]) LIMIT @cap) c)`

func (r *Reader) outboxQuarantine(ctx context.Context, tx pgx.Tx, s *Snapshot) error {
	p := reasonCountParams{Cap: r.cfg.CountCap}
	for _, x := range outbox.Reasons {
		p.Reasons = append(p.Reasons, string(x))
	}
	by, err := scanCounts(ctx, tx, sqlOutboxQuarantine, pgx.NamedArgs{"cap": p.Cap, "reasons": p.Reasons})
	if err != nil {
		return err
	}
	s.Outbox.QuarantinedByReason = by
	return nil
}

// inboxParams are the parameters of sqlInbox.
type inboxParams struct {
	Now *time.Time
	Cap int
}

// sqlInbox: pending rows are the partial index billing_events_due (which
// holds received_at); unprocessed rows are pending plus dead letters.
const sqlInbox = `
SELECT (SELECT count(*) FROM (SELECT 1 FROM billing_events
                               WHERE processed_at IS NULL AND dead_letter_at IS NULL LIMIT @cap) c),
       (SELECT coalesce(max(attempts), 0) FROM (SELECT attempts FROM billing_events
                               WHERE processed_at IS NULL AND dead_letter_at IS NULL LIMIT @cap) c),
       greatest(0, coalesce(extract(epoch FROM coalesce(@now::timestamptz, now()) -
           (SELECT received_at FROM billing_events WHERE processed_at IS NULL AND dead_letter_at IS NULL
             ORDER BY received_at LIMIT 1)), 0))::float8`

func (r *Reader) inboxFigures(ctx context.Context, tx pgx.Tx, s *Snapshot) error {
	p := inboxParams{Now: r.clk.Override(), Cap: r.cfg.CountCap}
	return tx.QueryRow(ctx, sqlInbox, pgx.NamedArgs{"now": p.Now, "cap": p.Cap}).Scan(
		&s.Inbox.Pending, &s.Inbox.HighestPendingAttempts, &s.Inbox.OldestPendingAgeSeconds)
}

// sqlInboxDeadLetters reads at most @cap entries of billing_events_dead_letter.
const sqlInboxDeadLetters = `
SELECT CASE WHEN d.reason = ANY(@reasons::text[]) THEN d.reason ELSE '` + ReasonOther + `' END, count(*)
  FROM (SELECT coalesce(last_reason, '') AS reason FROM billing_events
         WHERE processed_at IS NULL AND dead_letter_at IS NOT NULL LIMIT @cap) d
 GROUP BY 1`

func (r *Reader) inboxDeadLetters(ctx context.Context, tx pgx.Tx, s *Snapshot) error {
	p := reasonCountParams{Cap: r.cfg.CountCap}
	for _, x := range inbox.Reasons {
		p.Reasons = append(p.Reasons, string(x))
	}
	by, err := scanCounts(ctx, tx, sqlInboxDeadLetters, pgx.NamedArgs{"cap": p.Cap, "reasons": p.Reasons})
	if err != nil {
		return err
	}
	for _, x := range p.Reasons {
		by[x] += 0
	}
	by[ReasonOther] += 0
	s.Inbox.DeadLetters = by
	return nil
}

// scanCounts reads (label, count) rows, summing rows of the same label.
func scanCounts(ctx context.Context, tx pgx.Tx, sql string, args pgx.NamedArgs) (map[string]int64, error) {
	rows, err := tx.Query(ctx, sql, args)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	var (
		label string
		n     int64
	)
	_, err = pgx.ForEachRow(rows, []any{&label, &n}, func() error {
		out[label] += n
		return nil
	})
	return out, err
}

// reconParams are the parameters of sqlReconciliation.
type reconParams struct {
	Now   *time.Time
	Cap   int
	Kinds []string // the known kinds; anything else counts as ReasonOther
}

// sqlReconciliation reads at most @cap entries of
// reconciliation_items_open_idx (first_seen_at, id), oldest first, so each
// kind's oldest age is exact whatever the cap.
const sqlReconciliation = `
SELECT CASE WHEN o.kind = ANY(@kinds::text[]) THEN o.kind ELSE '` + ReasonOther + `' END,
       count(*),
       greatest(0, extract(epoch FROM coalesce(@now::timestamptz, now()) - min(o.first_seen_at)))::float8
  FROM (SELECT kind, first_seen_at FROM reconciliation_items
         WHERE state = 'open' ORDER BY first_seen_at, id LIMIT @cap) o
 GROUP BY 1`

func (r *Reader) reconciliation(ctx context.Context, tx pgx.Tx, s *Snapshot) error {
	p := reconParams{Now: r.clk.Override(), Cap: r.cfg.CountCap}
	for _, k := range reconciler.Kinds {
		p.Kinds = append(p.Kinds, string(k))
	}
	rows, err := tx.Query(ctx, sqlReconciliation, pgx.NamedArgs{"now": p.Now, "cap": p.Cap, "kinds": p.Kinds})
	if err != nil {
		return err
	}
	open, oldest := map[string]int64{}, map[string]float64{}
	for _, k := range append(p.Kinds, ReasonOther) {
		open[k], oldest[k] = 0, 0
	}
	var (
		kind string
		n    int64
		age  float64
	)
	if _, err := pgx.ForEachRow(rows, []any{&kind, &n, &age}, func() error {
		open[kind] += n
		oldest[kind] = max(oldest[kind], age)
		return nil
	}); err != nil {
		return err
	}
	s.Reconciliation = Reconciliation{OpenByKind: open, OldestOpenAgeSecondsByKind: oldest}
	return nil
}

// eventParams are the parameters of sqlEvents and sqlEventConsumers.
type eventParams struct {
	Now *time.Time
	Cap int
}

// sqlEvents: the undispatched rows are the partial index event_outbox_due
// (pending, failed); dead letters the partial index event_outbox_dead
// (migration 00303). Both near empty when healthy.
const sqlEvents = `
SELECT greatest(0, coalesce(extract(epoch FROM coalesce(@now::timestamptz, now()) -
           (SELECT min(created_at) FROM (SELECT created_at FROM event_outbox
                                          WHERE status IN ('pending', 'failed') LIMIT @cap) u)), 0))::float8,
       (SELECT count(*) FROM (SELECT 1 FROM event_outbox WHERE status = 'dead_letter' LIMIT @cap) d)`

func (r *Reader) eventFigures(ctx context.Context, tx pgx.Tx, s *Snapshot) error {
	p := eventParams{Now: r.clk.Override(), Cap: r.cfg.CountCap}
	return tx.QueryRow(ctx, sqlEvents, pgx.NamedArgs{"now": p.Now, "cap": p.Cap}).Scan(
		&s.Events.UndispatchedOldestAgeSeconds, &s.Events.OutboxDeadLetters)
}

// sqlEventConsumers, one row per registered consumer (a handful): its dead
// letters (partial index event_inbox_dead, capped) and its catch-up lag, the
// rule of the consumer's own catch-up loop (shared/events: dispatched events
// of its types it has neither processed nor dead-lettered) over the @cap
// oldest dispatched events of its types (index event_outbox_dispatched).
const sqlEventConsumers = `
SELECT c.consumer,
       (SELECT count(*) FROM (SELECT 1 FROM event_inbox i
                               WHERE i.consumer = c.consumer AND i.dead_lettered_at IS NOT NULL LIMIT @cap) d),
       greatest(0, coalesce(extract(epoch FROM coalesce(@now::timestamptz, now()) - (
           SELECT min(o.dispatched_at)
             FROM (SELECT event_id, dispatched_at FROM event_outbox
                    WHERE status = 'dispatched' AND event_type = ANY (c.event_types)
                    ORDER BY dispatched_at LIMIT @cap) o
            WHERE NOT EXISTS (SELECT 1 FROM event_inbox i
                               WHERE i.consumer = c.consumer AND i.event_id = o.event_id
                                 AND (i.status = 'processed' OR i.dead_lettered_at IS NOT NULL)))), 0))::float8
  FROM event_consumers c`

func (r *Reader) eventConsumers(ctx context.Context, tx pgx.Tx, s *Snapshot) error {
	p := eventParams{Now: r.clk.Override(), Cap: r.cfg.CountCap}
	rows, err := tx.Query(ctx, sqlEventConsumers, pgx.NamedArgs{"now": p.Now, "cap": p.Cap})
	if err != nil {
		return err
	}
	dead, lag := map[string]int64{}, map[string]float64{}
	var (
		consumer string
		n        int64
		age      float64
	)
	if _, err := pgx.ForEachRow(rows, []any{&consumer, &n, &age}, func() error {
		dead[consumer], lag[consumer] = n, age
		return nil
	}); err != nil {
		return err
	}
	s.Events.ConsumerDeadLetters, s.Events.ConsumerLagSeconds = dead, lag
	return nil
}
