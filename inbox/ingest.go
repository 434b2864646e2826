package inbox

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrStore is wrapped by every failure to store a received event: the
// endpoint answers 5xx and Stripe redelivers.
var ErrStore = errors.New("inbox: store failed")

// Received is a verified event ready to be stored.
type Received struct {
	EventID    string
	Type       string
	APIVersion string     // "" when absent
	Created    *time.Time // nil when absent
	Livemode   bool
	Customer   string // "" when data.object names none
	Payload    []byte // the raw body, verbatim
}

// StoreResult says what Ingest did.
type StoreResult int

const (
	// StoreInserted: a new row was committed.
	StoreInserted StoreResult = iota + 1
	// StoreDuplicate: the event id was already stored with the same body.
	StoreDuplicate
	// StoreConflict: the event id was already stored with another body; the
	// new body is kept in billing_event_id_conflicts, never applied.
	StoreConflict
)

// Store writes received events into billing_events. Concurrent Ingest
// calls are grouped: a few flushers each take every request waiting at that
// moment and store them with one multi-row INSERT (one commit, one WAL
// flush), then answer each caller after the commit. A request never waits
// for a timer, only for the flush in progress. Close stops the flushers.
type Store struct {
	pool  *pgxpool.Pool
	clock clock.Clock

	once      sync.Once
	closeOnce sync.Once
	reqs      chan *ingestReq
	quit      chan struct{}
}

// Group-commit bounds.
const (
	ingestFlushers = 4  // concurrent multi-row INSERTs
	ingestMaxBatch = 64 // events per INSERT
	flushTimeout   = 10 * time.Second
)

type ingestReq struct {
	ev   Received
	sum  [32]byte
	done chan ingestRes // buffered 1
}

type ingestRes struct {
	res StoreResult
	err error
}

// NewStore returns a Store on pool; c nil means the database clock.
func NewStore(pool *pgxpool.Pool, c clock.Clock) *Store {
	return &Store{pool: pool, clock: clock.Or(c), reqs: make(chan *ingestReq), quit: make(chan struct{})}
}

// Close stops the flushers; Ingest afterwards fails with ErrStore.
func (s *Store) Close() {
	s.once.Do(func() {}) // no flusher starts after Close
	s.closeOnce.Do(func() { close(s.quit) })
}

const sqlIngestBatch = `
INSERT INTO billing_events
    (event_id, event_type, api_version, event_created, livemode, customer_id, payload, payload_sha256, received_at, next_attempt_at)
SELECT id, typ, NULLIF(api, ''), created, live, NULLIF(cus, ''), body, sum, coalesce($9::timestamptz, now()), coalesce($9::timestamptz, now())
  FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], $5::bool[], $6::text[], $7::bytea[], $8::bytea[])
       AS t(id, typ, api, created, live, cus, body, sum)
ON CONFLICT (event_id) DO NOTHING
RETURNING event_id`

const sqlIngestConflict = `
WITH existing AS (SELECT payload_sha256 FROM billing_events WHERE event_id = $1)
INSERT INTO billing_event_id_conflicts (event_id, payload, payload_sha256, received_at)
SELECT $1, $2, $3, coalesce($4::timestamptz, now()) FROM existing WHERE existing.payload_sha256 <> $3
ON CONFLICT (event_id, payload_sha256) DO NOTHING
RETURNING 1`

// Ingest stores ev durably and returns only after the commit. A
// redelivery of a stored id is StoreDuplicate (or StoreConflict when the
// body differs). Errors wrap ErrStore; when ctx ends first the caller gets
// ErrStore even if the row commits later (a redelivery is then a
// duplicate).
func (s *Store) Ingest(ctx context.Context, ev Received) (StoreResult, error) {
	s.once.Do(func() {
		for i := 0; i < ingestFlushers; i++ {
			go s.flusher()
		}
	})
	req := &ingestReq{ev: ev, sum: sha256.Sum256(ev.Payload), done: make(chan ingestRes, 1)}
	select {
	case s.reqs <- req:
	case <-s.quit:
		return 0, fmt.Errorf("%w: store closed", ErrStore)
	case <-ctx.Done():
		return 0, fmt.Errorf("%w: %w", ErrStore, ctx.Err())
	}
	select {
	case r := <-req.done:
		return r.res, r.err
	case <-ctx.Done():
		return 0, fmt.Errorf("%w: %w", ErrStore, ctx.Err())
	}
}

func (s *Store) flusher() {
	batch := make([]*ingestReq, 0, ingestMaxBatch)
	for {
		batch = batch[:0]
		select {
		case r := <-s.reqs:
			batch = append(batch, r)
		case <-s.quit:
			return
		}
	drain:
		for len(batch) < ingestMaxBatch {
			select {
			case r := <-s.reqs:
				batch = append(batch, r)
			default:
				break drain
			}
		}
		s.flush(batch)
	}
}

// flush stores batch with one INSERT and answers every request.
func (s *Store) flush(batch []*ingestReq) {
	ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	defer cancel()
	n := len(batch)
	ids, types, apis, customers := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	created, live := make([]*time.Time, n), make([]bool, n)
	bodies, sums := make([][]byte, n), make([][]byte, n)
	first := make(map[string]int, n)
	for i, r := range batch {
		ids[i], types[i], apis[i], customers[i] = r.ev.EventID, r.ev.Type, r.ev.APIVersion, r.ev.Customer
		created[i], live[i], bodies[i], sums[i] = r.ev.Created, r.ev.Livemode, r.ev.Payload, r.sum[:]
		if _, seen := first[r.ev.EventID]; !seen {
			first[r.ev.EventID] = i
		}
	}
	now := s.clock.Override()
	rows, err := s.pool.Query(ctx, sqlIngestBatch, ids, types, apis, created, live, customers, bodies, sums, now)
	var inserted []string
	if err == nil {
		inserted, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		for _, r := range batch {
			r.done <- ingestRes{err: fmt.Errorf("%w: %w", ErrStore, err)}
		}
		return
	}
	isNew := make(map[string]bool, len(inserted))
	for _, id := range inserted {
		isNew[id] = true
	}
	for i, r := range batch {
		if isNew[r.ev.EventID] && first[r.ev.EventID] == i {
			r.done <- ingestRes{res: StoreInserted}
			continue
		}
		res, err := s.redelivered(ctx, r, now)
		r.done <- ingestRes{res: res, err: err}
	}
}

// redelivered classifies an event id that was already stored.
func (s *Store) redelivered(ctx context.Context, r *ingestReq, now *time.Time) (StoreResult, error) {
	var one int
	err := s.pool.QueryRow(ctx, sqlIngestConflict, r.ev.EventID, r.ev.Payload, r.sum[:], now).Scan(&one)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// the same body, or this conflicting body was already kept
		var same bool
		if err := s.pool.QueryRow(ctx, `SELECT payload_sha256 = $2 FROM billing_events WHERE event_id = $1`, r.ev.EventID, r.sum[:]).Scan(&same); err != nil {
			return 0, fmt.Errorf("%w: %w", ErrStore, err)
		}
		if same {
			return StoreDuplicate, nil
		}
		return StoreConflict, nil
	case err != nil:
		return 0, fmt.Errorf("%w: %w", ErrStore, err)
	default:
		return StoreConflict, nil
	}
}
