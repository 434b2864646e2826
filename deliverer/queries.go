package deliverer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what the deliverer needs from Postgres: a *pgxpool.Pool (or a
// *pgx.Conn in tests).
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// The deliverer's statements. Each is a named query with a typed Params
// struct whose args method is the only place its parameters are spelled:
//
//   - claimQuery (claimParams): lease a batch of messages' rows;
//   - recordQuery (recordParams): write a batch of outcomes, fenced;
//   - deferQuery (deferParams): hand a hot lane's surplus back to the relay;
//   - recallQuery (recallParams): bring deferred rows forward once their
//     lane has room;
//   - adoptQuery (adoptParams): find the deferred rows of a lane another
//     owner deferred.
//
// Which columns of outbox_items each writes: shared/outbox/columns.go.

// claimQuery claims a batch of items by id in one statement (one round trip
// for the whole batch):
//
//   - req is the batch: (id, dispatch, key) per message, ids unique;
//   - cand locks the claimable ones with FOR UPDATE SKIP LOCKED: the
//     message's dispatch, exporter and key, and pending-and-due or
//     leased-with-expired-lease, by the clock @now;
//   - peek is each row as it was, for the verdict (cand's copy of the rows
//     it locked, one lookup for the others);
//   - ctxk/ctx read each one's account, customer, mapping and cutover
//     watermark, once per (tenant, account, feature);
//   - upd leases the rows (lease_token+1, attempts+1, first_attempt_at,
//     lease_expires_at = now + lease, leased_at = now);
//   - gone writes the attempt row of a silent previous holder (see there);
//     the new lease's attempt row is written with its outcome (recordQuery).
//
// One call at a time per lane is not decided here: the lane's owner runs
// its items one at a time (lane.go).
const claimQuery = `
WITH clk AS (SELECT coalesce(@now::timestamptz, now()) AS now),
req AS (SELECT * FROM unnest(@ids::bigint[], @dispatches::int[], @keys::text[]) AS r(id, dispatch, key)),
cand AS MATERIALIZED (
    -- One primary-key lookup per requested id (LATERAL): with stale
    -- statistics the planner otherwise answered the state predicate with a
    -- bitmap scan of the partial due/expiry indexes, reading every due row
    -- of the table for each batch.
    SELECT c.id, c.tenant, c.destination_account, c.feature, c.lease_token,
           c.state AS prev_state, c.attempts AS prev_attempts, c.leased_at AS prev_leased_at,
           c.dispatch AS prev_dispatch, c.exporter AS prev_exporter, c.idempotency_key AS prev_key,
           c.next_attempt_at AS prev_next_attempt_at, c.lease_expires_at AS prev_lease_expires_at
    FROM req r CROSS JOIN clk
    CROSS JOIN LATERAL (
        SELECT i.id, i.tenant, i.destination_account, i.feature, i.lease_token, i.state, i.attempts, i.leased_at,
               i.dispatch, i.exporter, i.idempotency_key, i.next_attempt_at, i.lease_expires_at
        FROM outbox_items i
        WHERE i.id = r.id AND i.dispatch = r.dispatch AND i.exporter = @exporter AND i.idempotency_key = r.key
          AND ((i.state = 'pending' AND i.next_attempt_at <= clk.now)
            OR (i.state = 'leased' AND i.lease_expires_at < clk.now))
        FOR UPDATE OF i SKIP LOCKED
    ) c
),
peek AS (
    SELECT c.id, c.prev_state AS state, c.prev_dispatch AS dispatch, c.prev_exporter AS exporter,
           c.prev_key AS idempotency_key, c.prev_next_attempt_at AS next_attempt_at, c.prev_lease_expires_at AS lease_expires_at
    FROM cand c
    UNION ALL
    SELECT o.id, o.state, o.dispatch, o.exporter, o.idempotency_key, o.next_attempt_at, o.lease_expires_at
    FROM req r
    CROSS JOIN LATERAL (SELECT * FROM outbox_items o WHERE o.id = r.id LIMIT 1) o
    WHERE r.id NOT IN (SELECT id FROM cand)
),
ctxk AS MATERIALIZED (
    SELECT c.tenant, c.destination_account, c.feature,
           a.mode AS account_mode, a.confirmed AS account_confirmed, a.exporter AS account_exporter, b.stripe_customer,
           m.meter_id, m.event_name, m.customer_key, m.value_key, m.mapping_version AS current_mapping_version,
           w.watermark
    FROM (SELECT DISTINCT tenant, destination_account, feature FROM cand) c
    -- One primary-key lookup each (LATERAL, LIMIT 1 so the planner keeps it a lookup).
    LEFT JOIN LATERAL (
        SELECT a.mode, a.confirmed, a.exporter FROM stripe_accounts a WHERE a.account_id = c.destination_account LIMIT 1
    ) a ON true
    LEFT JOIN LATERAL (
        SELECT b.stripe_customer FROM tenant_billing b
        WHERE b.tenant = c.tenant AND b.destination_account = c.destination_account LIMIT 1
    ) b ON true
    LEFT JOIN LATERAL (
        SELECT m.meter_id, m.event_name, m.customer_key, m.value_key, m.mapping_version
        FROM meter_mappings m WHERE m.destination_account = c.destination_account AND m.feature = c.feature LIMIT 1
    ) m ON true
    LEFT JOIN LATERAL (
        SELECT u.watermark FROM usage_cutovers u
        WHERE u.feature = c.feature AND u.tenant IN (c.tenant, '')
        ORDER BY u.tenant = '' LIMIT 1
    ) w ON true
),
ctx AS MATERIALIZED (
    SELECT c.id, k.account_mode, k.account_confirmed, k.account_exporter, k.stripe_customer, k.meter_id, k.event_name,
           k.customer_key, k.value_key, k.current_mapping_version, k.watermark
    -- LEFT: every cand row has its ctxk row, and the outer join keeps the
    -- planner's estimate at cand's size, so the final join by id is hashed.
    -- The inner join was estimated at one row and joined by a nested loop:
    -- n² comparisons for a batch of n.
    FROM cand c LEFT JOIN ctxk k USING (tenant, destination_account, feature)
),
upd AS (
    UPDATE outbox_items o SET
        state = 'leased',
        lease_token = o.lease_token + 1,
        attempts = o.attempts + 1,
        first_attempt_at = coalesce(o.first_attempt_at, clk.now),
        lease_expires_at = clk.now + @lease::interval,
        leased_at = clk.now,
        updated_at = now() -- the database's clock, as the update trigger's rule (migration 00309)
    FROM cand c CROSS JOIN clk
    WHERE o.id = c.id
    RETURNING o.id, o.lease_token, o.attempts, o.first_attempt_at, o.lease_expires_at, o.destination_account,
              o.subject_kind, o.mode, o.mapping_version, o.quantity, o.occurred_at, o.period_start
),
-- A reclaim writes the attempt of the holder that went silent (its lease
-- expired with no outcome: a killed worker never writes one) as
-- stale_lease, so every lease ends with an attempt row. If the holder was
-- only slow, its late write is refused as stale and fills in what the call
-- answered (recordQuery). Attempt rows are written once (migration 00011).
gone AS (
    INSERT INTO outbox_attempts (item_id, attempt, lease_token, started_at, finished_at, outcome, error_code)
    SELECT c.id, c.prev_attempts, c.lease_token, coalesce(c.prev_leased_at, clk.now), clk.now, 'stale_lease', 'lease_taken_over'
    FROM cand c JOIN upd u ON u.id = c.id CROSS JOIN clk
    WHERE c.prev_state = 'leased'
    ON CONFLICT (item_id, lease_token) DO NOTHING
)
SELECT r.id, clk.now, p.id IS NOT NULL, p.state, p.dispatch, p.exporter, p.idempotency_key, p.next_attempt_at, p.lease_expires_at,
       u.id IS NOT NULL, u.lease_token, u.attempts, u.first_attempt_at, u.lease_expires_at, u.destination_account,
       u.subject_kind, u.mode, u.mapping_version, u.quantity, u.occurred_at, u.period_start,
       x.account_mode, x.account_confirmed, x.account_exporter, x.stripe_customer, x.meter_id, x.event_name, x.customer_key, x.value_key,
       x.current_mapping_version, x.watermark
FROM req r
CROSS JOIN clk
LEFT JOIN peek p ON p.id = r.id
LEFT JOIN upd u ON u.id = r.id
LEFT JOIN ctx x ON x.id = r.id`

// claimRequest is one message to claim the row of.
type claimRequest struct {
	ItemID   int64
	Dispatch int32
	Key      string
}

// claimParams are claimQuery's parameters: the requests (item ids unique),
// the exporter the rows must belong to, the lease to take and the clock
// override (nil = the database's now()).
type claimParams struct {
	Now      *time.Time
	Exporter string
	Lease    time.Duration
	Items    []claimRequest
}

func (p claimParams) args() pgx.NamedArgs {
	ids, dispatches, keys := make([]int64, len(p.Items)), make([]int32, len(p.Items)), make([]string, len(p.Items))
	for i, r := range p.Items {
		ids[i], dispatches[i], keys[i] = r.ItemID, r.Dispatch, r.Key
	}
	return pgx.NamedArgs{"now": p.Now, "exporter": p.Exporter, "lease": p.Lease, "ids": ids, "dispatches": dispatches, "keys": keys}
}

// verdict is what the claim decided about a message.
type verdict int

const (
	verdictClaimed       verdict = iota // leased to us: attempt it
	verdictNotFound                     // no row with that id
	verdictMismatch                     // row exists but its key or exporter differ from the message
	verdictStaleDispatch                // the message is of another dispatch generation
	verdictTerminal                     // accepted, confirmed, uncertain, rejected, quarantined
	verdictNotDue                       // pending, next_attempt_at in the future
	verdictLeasedLive                   // leased by someone else, lease not expired
	verdictLocked                       // claimable, but another transaction holds the row lock
)

func (v verdict) String() string {
	switch v {
	case verdictClaimed:
		return "claimed"
	case verdictNotFound:
		return "not_found"
	case verdictMismatch:
		return "mismatch"
	case verdictStaleDispatch:
		return "stale_dispatch"
	case verdictTerminal:
		return "terminal"
	case verdictNotDue:
		return "not_due"
	case verdictLeasedLive:
		return "leased_live"
	case verdictLocked:
		return "locked"
	default:
		return fmt.Sprintf("verdict(%d)", int(v))
	}
}

// claimed is a row leased to this worker plus its send context.
type claimed struct {
	ItemID         int64
	Key            string
	LeaseToken     int64
	Attempts       int32
	FirstAttemptAt time.Time
	LeaseExpiresAt time.Time
	LeasedAt       time.Time // the claim's database time: the attempt's started_at
	Account        string
	Item           checkItem
	Ctx            sendContext
}

// claimResult is the answer for one claimRequest.
type claimResult struct {
	Verdict        verdict
	Now            time.Time // the database clock (or the override) of the claim
	State          outbox.State
	NextAttemptAt  time.Time
	LeaseExpiresAt *time.Time
	Item           claimed // set when Verdict == verdictClaimed
}

// claimItems runs claimQuery and returns one result per request, in order.
// Errors: the database's, wrapped.
func claimItems(ctx context.Context, db DB, p claimParams) ([]claimResult, error) {
	rows, err := db.Query(ctx, claimQuery, p.args())
	if err != nil {
		return nil, fmt.Errorf("deliverer: claim %d items: %w", len(p.Items), err)
	}
	defer rows.Close()
	byReq := make(map[int64]claimRequest, len(p.Items))
	for _, r := range p.Items {
		byReq[r.ItemID] = r
	}
	byID := make(map[int64]claimResult, len(p.Items))
	for rows.Next() {
		var (
			id                       int64
			r                        claimResult
			found, leased            bool
			state, exp, key          *string
			dispatch                 *int32
			nextAttempt              *time.Time
			peekLeaseExp             *time.Time
			token                    *int64
			attempts, mappingVersion *int32
			firstAttempt, leaseExp   *time.Time
			account, kind, mode      *string
			quantity                 *int64
			occurredAt, periodStart  *time.Time
			sc                       sendContext
			accountExporter          *string
		)
		err := rows.Scan(&id,
			&r.Now, &found, &state, &dispatch, &exp, &key, &nextAttempt, &peekLeaseExp,
			&leased, &token, &attempts, &firstAttempt, &leaseExp, &account,
			&kind, &mode, &mappingVersion, &quantity, &occurredAt, &periodStart,
			&sc.AccountMode, &sc.AccountConfirmed, &accountExporter, &sc.StripeCustomer, &sc.MeterID, &sc.EventName, &sc.CustomerKey, &sc.ValueKey,
			&sc.CurrentMappingVersion, &sc.Watermark)
		if err != nil {
			return nil, fmt.Errorf("deliverer: claim: scan: %w", err)
		}
		sc.Exporter = deref(accountExporter, ExporterV1)
		req := byReq[id]
		if !found {
			r.Verdict = verdictNotFound
			byID[id] = r
			continue
		}
		r.State = outbox.State(*state)
		r.NextAttemptAt = *nextAttempt
		r.LeaseExpiresAt = peekLeaseExp
		switch {
		case leased:
			r.Verdict = verdictClaimed
			r.Item = claimed{
				ItemID: id, Key: req.Key, LeaseToken: *token, Attempts: *attempts,
				FirstAttemptAt: *firstAttempt, LeaseExpiresAt: *leaseExp, LeasedAt: r.Now, Account: *account,
				Item: checkItem{
					SubjectKind: identity.SubjectKind(*kind), Mode: identity.Mode(*mode), MappingVersion: *mappingVersion,
					Quantity: *quantity, OccurredAt: *occurredAt, PeriodStart: *periodStart,
				},
				Ctx: sc,
			}
		case *exp != p.Exporter || *key != req.Key:
			r.Verdict = verdictMismatch
		case *dispatch != req.Dispatch:
			r.Verdict = verdictStaleDispatch
		default:
			r.Verdict = stateVerdict(r.State, r.NextAttemptAt, r.LeaseExpiresAt, r.Now)
		}
		byID[id] = r
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("deliverer: claim %d items: %w", len(p.Items), err)
	}
	out := make([]claimResult, len(p.Items))
	for i, req := range p.Items {
		r, ok := byID[req.ItemID]
		if !ok {
			return nil, fmt.Errorf("deliverer: claim: no answer for item %d", req.ItemID)
		}
		out[i] = r
	}
	return out, nil
}

// stateVerdict explains why a row of the message's dispatch was not claimed.
func stateVerdict(s outbox.State, next time.Time, leaseExp *time.Time, now time.Time) verdict {
	switch s {
	case outbox.StateAccepted, outbox.StateConfirmed, outbox.StateUncertain, outbox.StateRejected, outbox.StateQuarantined:
		return verdictTerminal
	case outbox.StatePending:
		if next.After(now) {
			return verdictNotDue
		}
		return verdictLocked
	case outbox.StateLeased:
		if leaseExp != nil && !leaseExp.Before(now) {
			return verdictLeasedLive
		}
		return verdictLocked
	default:
		return verdictTerminal // unknown states are refused by the CHECK constraint
	}
}

// record is one fenced outcome write.
type record struct {
	Item       claimed
	Outcome    Outcome // never OutcomeStaleLease
	Reason     outbox.Reason
	RetryDelay time.Duration // OutcomeRetry only
	LastError  string        // "" keeps the row's last_error
	Result     Result
	// Wait (OutcomeRetry only): a correction waiting for the record it
	// corrects (correction.go). The claim's attempt is given back:
	// attempts - 1, and first_attempt_at cleared when no attempt is left,
	// so waiting never counts toward the attempts limit or the horizon.
	Wait bool
}

// recordQuery leaves leased for a batch in one statement (one round trip),
// each row fenced by state = 'leased' AND lease_token = its token: the item
// moves to its state (a retry to pending with next_attempt_at = now + delay
// and dispatch + 1, so the relay publishes a new generation once due); the
// attempt row is written with its outcome, or stale_lease when the fenced
// update matched zero rows (filling in the row a takeover wrote, if any).
// Returns, per record, whether it moved.
const recordQuery = `
WITH clk AS (SELECT coalesce(@now::timestamptz, now()) AS now),
rec AS (
    SELECT * FROM unnest(@ids::bigint[], @tokens::bigint[], @states::text[], @reasons::text[], @delays::interval[],
                         @last_errors::text[], @provider_refs::text[], @outcomes::text[], @http_statuses::int[],
                         @request_ids::text[], @codes::text[], @messages::text[], @attempts::int[], @started::timestamptz[],
                         @waits::bool[])
        AS r(id, token, state, reason, delay, last_error, provider_ref, outcome, http_status, request_id, code, msg,
             attempt, started, wait)
),
upd AS (
    UPDATE outbox_items o SET
        state = r.state,
        quarantine_reason = r.reason,
        lease_expires_at = NULL,
        next_attempt_at = CASE WHEN r.state = 'pending' THEN clk.now + r.delay ELSE o.next_attempt_at END,
        dispatch = CASE WHEN r.state = 'pending' THEN o.dispatch + 1 ELSE o.dispatch END,
        attempts = CASE WHEN r.wait THEN greatest(o.attempts - 1, 0) ELSE o.attempts END,
        first_attempt_at = CASE WHEN r.wait AND o.attempts <= 1 THEN NULL ELSE o.first_attempt_at END,
        last_error = coalesce(r.last_error, o.last_error),
        provider_ref = coalesce(r.provider_ref, o.provider_ref),
        updated_at = now() -- the database's clock, as the update trigger's rule (migration 00309)
    FROM rec r CROSS JOIN clk
    WHERE o.id = r.id AND o.state = 'leased' AND o.lease_token = r.token
    RETURNING o.id
),
att AS (
    INSERT INTO outbox_attempts AS a (item_id, attempt, lease_token, started_at, finished_at, outcome,
                                      http_status, stripe_request_id, error_code, error_message)
    SELECT r.id, r.attempt, r.token, r.started, clk.now,
           CASE WHEN r.id IN (SELECT id FROM upd) THEN r.outcome ELSE 'stale_lease' END,
           r.http_status, r.request_id, r.code, r.msg
    FROM rec r CROSS JOIN clk
    ON CONFLICT (item_id, lease_token) DO UPDATE SET
        finished_at = excluded.finished_at, outcome = excluded.outcome, http_status = excluded.http_status,
        stripe_request_id = excluded.stripe_request_id, error_code = excluded.error_code, error_message = excluded.error_message
)
SELECT r.id, r.id IN (SELECT id FROM upd) FROM rec r`

// recordParams are recordQuery's parameters: the records (item ids unique)
// and the clock override (nil = the database's now()).
type recordParams struct {
	Now     *time.Time
	Records []record
}

// lastErrorMax bounds last_error, provider_ref and an attempt's
// stripe_request_id, error_code and error_message, in bytes (cut on a UTF-8
// character boundary, NUL and invalid bytes replaced: truncateUTF8), so no
// exporter's answer can fail the outcome batch in Postgres.
const lastErrorMax = 500

func (p recordParams) args() pgx.NamedArgs {
	n := len(p.Records)
	ids, tokens := make([]int64, n), make([]int64, n)
	states, outcomes := make([]string, n), make([]string, n)
	delays := make([]time.Duration, n)
	reasons, lastErrs, refs, reqIDs, codes, msgs := make([]*string, n), make([]*string, n), make([]*string, n),
		make([]*string, n), make([]*string, n), make([]*string, n)
	statuses := make([]*int32, n)
	attempts, started := make([]int32, n), make([]time.Time, n)
	waits := make([]bool, n)
	str := func(s string) *string {
		if s == "" {
			return nil
		}
		return &s
	}
	for i, r := range p.Records {
		ids[i], tokens[i] = r.Item.ItemID, r.Item.LeaseToken
		attempts[i], started[i] = r.Item.Attempts, r.Item.LeasedAt
		states[i], outcomes[i] = string(r.Outcome.nextState()), string(r.Outcome)
		waits[i] = r.Wait && r.Outcome == OutcomeRetry
		delays[i] = r.RetryDelay
		if r.Outcome == OutcomeQuarantined {
			reasons[i] = str(string(r.Reason))
		}
		lastErrs[i] = str(truncateUTF8(r.LastError, lastErrorMax))
		if r.Outcome == OutcomeAccepted {
			refs[i] = str(truncateUTF8(r.Result.ProviderRef, lastErrorMax))
		}
		reqIDs[i] = str(truncateUTF8(r.Result.RequestID, lastErrorMax))
		codes[i] = str(truncateUTF8(r.Result.ErrorCode, lastErrorMax))
		msgs[i] = str(truncateUTF8(r.Result.Message, lastErrorMax))
		if r.Result.HTTPStatus != 0 {
			st := int32(r.Result.HTTPStatus)
			statuses[i] = &st
		}
	}
	return pgx.NamedArgs{"now": p.Now, "ids": ids, "tokens": tokens, "states": states, "reasons": reasons, "delays": delays,
		"last_errors": lastErrs, "provider_refs": refs, "outcomes": outcomes, "http_statuses": statuses,
		"request_ids": reqIDs, "codes": codes, "messages": msgs, "attempts": attempts, "started": started, "waits": waits}
}

// recordOutcomes runs recordQuery. It returns one error per record (nil, or
// outbox.ErrStaleLease wrapped) and a database error for the batch.
func recordOutcomes(ctx context.Context, db DB, p recordParams) ([]error, error) {
	n := len(p.Records)
	rows, err := db.Query(ctx, recordQuery, p.args())
	if err != nil {
		return nil, fmt.Errorf("deliverer: record %d outcomes: %w", n, err)
	}
	moved := make(map[int64]bool, n)
	for rows.Next() {
		var id int64
		var ok bool
		if err := rows.Scan(&id, &ok); err != nil {
			rows.Close()
			return nil, fmt.Errorf("deliverer: record %d outcomes: scan: %w", n, err)
		}
		moved[id] = ok
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("deliverer: record %d outcomes: %w", n, err)
	}
	out := make([]error, n)
	for i, r := range p.Records {
		if !moved[r.Item.ItemID] {
			out[i] = fmt.Errorf("item %d lease_token %d: %w", r.Item.ItemID, r.Item.LeaseToken, outbox.ErrStaleLease)
		}
	}
	return out, nil
}

// deferQuery hands messages of a lane that already holds its share of this
// process back to the relay: each row still pending at the message's
// dispatch gets dispatch + 1 and is due at now + its delay at the earliest,
// so the relay publishes it again then (the message is acked). Rows that
// moved on (leased, another dispatch, terminal) are not touched; the
// statement returns the ids it moved. The state test is wrapped in IS TRUE
// so the planner answers it with primary-key lookups, not a scan of the
// pending index.
const deferQuery = `
UPDATE outbox_items o SET
    dispatch = o.dispatch + 1,
    next_attempt_at = greatest(o.next_attempt_at, coalesce(@now::timestamptz, now()) + d.delay)
FROM unnest(@ids::bigint[], @dispatches::int[], @delays::interval[]) AS d(id, dispatch, delay)
WHERE o.id = d.id AND o.dispatch = d.dispatch AND (o.state = 'pending') IS TRUE
RETURNING o.id`

// deferRequest is one message to defer by Delay.
type deferRequest struct {
	ItemID   int64
	Dispatch int32
	Delay    time.Duration
}

// deferParams are deferQuery's parameters.
type deferParams struct {
	Now   *time.Time
	Items []deferRequest
}

func (p deferParams) args() pgx.NamedArgs {
	ids, dispatches, delays := make([]int64, len(p.Items)), make([]int32, len(p.Items)), make([]time.Duration, len(p.Items))
	for i, r := range p.Items {
		ids[i], dispatches[i], delays[i] = r.ItemID, r.Dispatch, r.Delay
	}
	return pgx.NamedArgs{"now": p.Now, "ids": ids, "dispatches": dispatches, "delays": delays}
}

// deferItems runs deferQuery and returns the ids it moved.
func deferItems(ctx context.Context, db DB, p deferParams) (map[int64]bool, error) {
	rows, err := db.Query(ctx, deferQuery, p.args())
	if err != nil {
		return nil, fmt.Errorf("deliverer: defer %d items: %w", len(p.Items), err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("deliverer: defer %d items: %w", len(p.Items), err)
	}
	out := make(map[int64]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out, nil
}

// isStale reports whether err is outbox.ErrStaleLease.
func isStale(err error) bool { return errors.Is(err, outbox.ErrStaleLease) }

// recallQuery makes rows a lane deferred due now, once the lane has room
// again (lane.go, "Recall"), and wakes the relay on the outbox channel. A
// row moves only while it is still pending at the deferral's dispatch,
// unpublished and due later than now: a row the relay already published,
// or that moved on, is left alone, so a recall can only bring a due time
// forward. The statement returns the number of rows it moved.
const recallQuery = `
WITH clk AS (SELECT coalesce(@now::timestamptz, now()) AS now),
moved AS (
    UPDATE outbox_items o SET next_attempt_at = clk.now
    FROM unnest(@ids::bigint[], @dispatches::int[]) AS r(id, dispatch), clk
    WHERE o.id = r.id AND o.dispatch = r.dispatch AND (o.state = 'pending') IS TRUE
      AND o.published_dispatch < o.dispatch AND o.next_attempt_at > clk.now
    RETURNING o.id
), n AS (SELECT count(*) AS n FROM moved)
SELECT n.n, (SELECT count(*) FROM (SELECT pg_notify('aurora_outbox', '') FROM n WHERE n.n > 0) w)
FROM n`

// recallParams are recallQuery's parameters.
type recallParams struct {
	Now   *time.Time
	Items []deferredItem
}

func (p recallParams) args() pgx.NamedArgs {
	ids, dispatches := make([]int64, len(p.Items)), make([]int32, len(p.Items))
	for i, it := range p.Items {
		ids[i], dispatches[i] = it.ID, it.Dispatch
	}
	return pgx.NamedArgs{"now": p.Now, "ids": ids, "dispatches": dispatches}
}

// recallItems runs recallQuery and returns how many rows it moved.
func recallItems(ctx context.Context, db DB, p recallParams) (int64, error) {
	var n, woke int64
	if err := db.QueryRow(ctx, recallQuery, p.args()).Scan(&n, &woke); err != nil {
		return 0, fmt.Errorf("deliverer: recall %d deferred items: %w", len(p.Items), err)
	}
	return n, nil
}

// adoptQuery returns, oldest due first, the rows deferred on the lane of
// item @item that a recall may bring forward (lane.go, "Adoption"): the
// item's tenant, feature, destination account and exporter; pending,
// unpublished, due later than now; never attempted, so a row waiting out
// a retry's backoff is not among them. At most @limit rows.
//
// outbox_items has no index on state (migration 00311: the claim and the
// outcome stay heap-only updates), so the query reads the pending and
// leased items through outbox_undecided and looks each one up by id: a
// pass over the undecided items, once per lane a process adopts (a lane
// is adopted at most once; lane.go). A version that read the publish
// queue's rows due later than now instead found 188 of a dead owner's 381
// deferred rows at one take-over in the kill trial (BENCHMARKS.md,
// "Heap-only claims and outcomes").
const adoptQuery = `
WITH clk AS (SELECT coalesce(@now::timestamptz, now()) AS now),
me AS (SELECT tenant, feature, destination_account, exporter FROM outbox_items WHERE id = @item)
SELECT o.id, o.dispatch
FROM outbox_undecided u
JOIN outbox_items o ON o.id = u.item_id
CROSS JOIN me CROSS JOIN clk
WHERE o.state = 'pending' AND o.published_dispatch < o.dispatch AND o.next_attempt_at > clk.now
  AND o.attempts = 0 AND o.id <> @item
  AND o.tenant = me.tenant AND o.feature = me.feature
  AND o.destination_account = me.destination_account AND o.exporter = me.exporter
ORDER BY o.next_attempt_at
LIMIT @limit`

// adoptParams are adoptQuery's parameters.
type adoptParams struct {
	Now    *time.Time
	ItemID int64
	Limit  int
}

func (p adoptParams) args() pgx.NamedArgs {
	return pgx.NamedArgs{"now": p.Now, "item": p.ItemID, "limit": p.Limit}
}

// adoptItems runs adoptQuery.
func adoptItems(ctx context.Context, db DB, p adoptParams) ([]deferredItem, error) {
	rows, err := db.Query(ctx, adoptQuery, p.args())
	if err != nil {
		return nil, fmt.Errorf("deliverer: adopt deferred items of item %d: %w", p.ItemID, err)
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (deferredItem, error) {
		var it deferredItem
		err := r.Scan(&it.ID, &it.Dispatch)
		return it, err
	})
	if err != nil {
		return nil, fmt.Errorf("deliverer: adopt deferred items of item %d: %w", p.ItemID, err)
	}
	return items, nil
}
