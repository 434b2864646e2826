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
	verdictSlotBusy                     // claimable, but the (account, customer, meter) slot is held
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
	case verdictSlotBusy:
		return "slot_busy"
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

// hasSlot reports whether the claim took a delivery slot (customer and meter
// were known), which the outcome write must free.
func (c claimed) hasSlot() bool { return c.Ctx.StripeCustomer != nil && c.Ctx.MeterID != nil }

// claimResult is the answer of claimItem.
type claimResult struct {
	Verdict        verdict
	Now            time.Time // the database clock (or the override) of the claim
	State          outbox.State
	NextAttemptAt  time.Time
	LeaseExpiresAt *time.Time
	Item           claimed // set when Verdict == verdictClaimed
	// Slot is the delivery slot another lease holds (Verdict ==
	// verdictSlotBusy): where handOff can leave the item for its holder.
	Slot *slotKey
}

// slotKey names a delivery slot: (destination account, Stripe customer,
// Stripe meter id), delivery_slots' primary key.
type slotKey struct{ Account, Customer, Meter string }

// claimSQL claims a batch of items by id in one statement (one round trip
// for the whole batch):
//
//   - req is the batch: (id, dispatch, key, group) per message, ids unique;
//     a group is a lane's messages handled together (handleGroup);
//   - cand locks the claimable ones with FOR UPDATE SKIP LOCKED: the
//     message's dispatch, exporter and key, and pending-and-due (or pending
//     and handed: see claimParams.Handed) or leased-with-expired-lease, by
//     the clock $1;
//   - peek is each row as it was, for the verdict (cand's copy of the rows
//     it locked, one lookup for the others);
//   - ctx reads each one's account, customer, mapping and cutover watermark;
//   - want picks one contender per (account, customer, meter) in the batch
//     (the lowest id), in key order so concurrent batches lock slots in the
//     same order;
//   - slot takes the delivery slot for the contender when it is free or
//     expired (ON CONFLICT … DO UPDATE … WHERE expires_at < now); won names
//     the group that got it;
//   - upd leases the rows (lease_token+1, attempts+1, first_attempt_at,
//     lease_expires_at = now + lease) that need no slot, or whose group got
//     their slot: a group's items share the slot its lowest item holds, and
//     the group sends them one call at a time;
//   - gone writes the attempt row of a silent previous holder (see there);
//     the new lease's attempt row is written with its outcome (recordSQL).
const claimSQL = `
WITH clk AS (SELECT coalesce($1::timestamptz, now()) AS now),
req AS (SELECT * FROM unnest($2::bigint[], $3::int[], $4::text[], $7::bigint[], $8::bool[]) AS r(id, dispatch, key, grp, handed)),
cand AS MATERIALIZED (
    -- One primary-key lookup per requested id (LATERAL): with stale
    -- statistics the planner otherwise answered the state predicate with a
    -- bitmap scan of the partial due/expiry indexes, reading every due row
    -- of the table for each batch (measured: 23 M index tuples read to
    -- deliver 19 k items).
    SELECT c.id, r.grp, r.handed, c.tenant, c.destination_account, c.feature, c.lease_token,
           c.state AS prev_state, c.attempts AS prev_attempts, c.leased_at AS prev_leased_at,
           c.dispatch AS prev_dispatch, c.exporter AS prev_exporter, c.idempotency_key AS prev_key,
           c.next_attempt_at AS prev_next_attempt_at, c.lease_expires_at AS prev_lease_expires_at
    FROM req r CROSS JOIN clk
    CROSS JOIN LATERAL (
        SELECT i.id, i.tenant, i.destination_account, i.feature, i.lease_token, i.state, i.attempts, i.leased_at,
               i.dispatch, i.exporter, i.idempotency_key, i.next_attempt_at, i.lease_expires_at
        FROM outbox_items i
        WHERE i.id = r.id AND i.dispatch = r.dispatch AND i.exporter = $5 AND i.idempotency_key = r.key
          AND ((i.state = 'pending' AND (i.next_attempt_at <= clk.now OR r.handed))
            OR (i.state = 'leased' AND i.lease_expires_at < clk.now))
        FOR UPDATE OF i SKIP LOCKED
    ) c
),
peek AS (
    -- The rows as they were, for the verdict: a claimed row as cand locked
    -- it; any other by one primary-key lookup (LATERAL).
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
    -- The send context, once per (tenant, account, feature) of the batch:
    -- a group's items share it, so a batch of one group costs four lookups,
    -- not four per item.
    SELECT c.tenant, c.destination_account, c.feature,
           a.mode AS account_mode, a.confirmed AS account_confirmed, b.stripe_customer,
           m.meter_id, m.event_name, m.customer_key, m.value_key, m.mapping_version AS current_mapping_version,
           w.watermark
    FROM (SELECT DISTINCT tenant, destination_account, feature FROM cand) c
    -- One primary-key lookup each (LATERAL), for the reason given at cand.
    LEFT JOIN LATERAL (
        SELECT a.mode, a.confirmed FROM stripe_accounts a WHERE a.account_id = c.destination_account
        LIMIT 1 -- a key lookup; LIMIT keeps the planner from flattening it into a scan
    ) a ON true
    LEFT JOIN LATERAL (
        SELECT b.stripe_customer FROM tenant_billing b
        WHERE b.tenant = c.tenant AND b.destination_account = c.destination_account
        LIMIT 1
    ) b ON true
    LEFT JOIN LATERAL (
        SELECT m.meter_id, m.event_name, m.customer_key, m.value_key, m.mapping_version
        FROM meter_mappings m WHERE m.destination_account = c.destination_account AND m.feature = c.feature
        LIMIT 1
    ) m ON true
    LEFT JOIN LATERAL (
        SELECT u.watermark FROM usage_cutovers u
        WHERE u.feature = c.feature AND u.tenant IN (c.tenant, '')
        ORDER BY u.tenant = '' LIMIT 1
    ) w ON true
),
ctx AS MATERIALIZED (
    SELECT c.id, k.account_mode, k.account_confirmed, k.stripe_customer, k.meter_id, k.event_name,
           k.customer_key, k.value_key, k.current_mapping_version, k.watermark
    FROM cand c JOIN ctxk k USING (tenant, destination_account, feature)
),
want AS (
    SELECT DISTINCT ON (c.destination_account, x.stripe_customer, x.meter_id)
           c.id, c.grp, c.destination_account, x.stripe_customer, x.meter_id, c.lease_token
    FROM cand c JOIN ctx x ON x.id = c.id
    WHERE x.stripe_customer IS NOT NULL AND x.meter_id IS NOT NULL
    ORDER BY c.destination_account, x.stripe_customer, x.meter_id, c.id
),
slot AS (
    INSERT INTO delivery_slots AS s (destination_account, stripe_customer, meter_id, item_id, lease_token, expires_at)
    SELECT w.destination_account, w.stripe_customer, w.meter_id, w.id, w.lease_token + 1, clk.now + $6::interval
    FROM want w CROSS JOIN clk
    ORDER BY w.destination_account, w.stripe_customer, w.meter_id
    ON CONFLICT (destination_account, stripe_customer, meter_id) DO UPDATE
        SET item_id = excluded.item_id, lease_token = excluded.lease_token, expires_at = excluded.expires_at
        WHERE s.expires_at < coalesce($1::timestamptz, now())
    RETURNING s.item_id
),
won AS (
    SELECT w.grp, w.destination_account, w.stripe_customer, w.meter_id
    FROM want w WHERE w.id IN (SELECT item_id FROM slot)
),
upd AS (
    UPDATE outbox_items o SET
        state = 'leased',
        lease_token = o.lease_token + 1,
        attempts = o.attempts + 1,
        first_attempt_at = coalesce(o.first_attempt_at, clk.now),
        lease_expires_at = clk.now + $6::interval,
        leased_at = clk.now
    FROM cand c JOIN ctx x ON x.id = c.id CROSS JOIN clk
    WHERE o.id = c.id
      AND (x.stripe_customer IS NULL OR x.meter_id IS NULL OR EXISTS (
            SELECT 1 FROM won
            WHERE won.grp = c.grp AND won.destination_account = c.destination_account
              AND won.stripe_customer = x.stripe_customer AND won.meter_id = x.meter_id))
    RETURNING o.id, o.lease_token, o.attempts, o.first_attempt_at, o.lease_expires_at, o.destination_account,
              o.subject_kind, o.mode, o.mapping_version, o.quantity, o.occurred_at, o.period_start
),
-- A reclaim writes the attempt of the holder that went silent (its lease
-- expired with no outcome: a killed worker never writes one) as
-- stale_lease, so every lease ends with an attempt row. If the holder was
-- only slow, its late write is refused as stale and fills in what the call
-- answered (recordSQL). Attempt rows are written once (migration 00011).
gone AS (
    INSERT INTO outbox_attempts (item_id, attempt, lease_token, started_at, finished_at, outcome, error_code)
    SELECT c.id, c.prev_attempts, c.lease_token, coalesce(c.prev_leased_at, clk.now), clk.now, 'stale_lease', 'lease_taken_over'
    FROM cand c JOIN upd u ON u.id = c.id CROSS JOIN clk
    WHERE c.prev_state = 'leased'
    ON CONFLICT (item_id, lease_token) DO NOTHING
)
SELECT r.id, clk.now, p.id IS NOT NULL, p.state, p.dispatch, p.exporter, p.idempotency_key, p.next_attempt_at, p.lease_expires_at,
       c.id IS NOT NULL,
       u.id IS NOT NULL, u.lease_token, u.attempts, u.first_attempt_at, u.lease_expires_at, u.destination_account,
       u.subject_kind, u.mode, u.mapping_version, u.quantity, u.occurred_at, u.period_start,
       x.account_mode, x.account_confirmed, x.stripe_customer, x.meter_id, x.event_name, x.customer_key, x.value_key,
       x.current_mapping_version, x.watermark, c.destination_account
FROM req r
CROSS JOIN clk
LEFT JOIN peek p ON p.id = r.id
LEFT JOIN cand c ON c.id = r.id
LEFT JOIN upd u ON u.id = r.id
LEFT JOIN ctx x ON x.id = r.id`

// claimParams names the message and the lease to take.
type claimParams struct {
	Now      *time.Time // clock override; nil = database now()
	ItemID   int64
	Dispatch int32
	Exporter string
	Key      string
	Lease    time.Duration
	// Group: requests of one group may share a delivery slot (handleGroup
	// sends them one at a time). 0 = a group of its own.
	Group int64
	// Handed: the item was handed to this process (handOff) and taken by
	// its outcome write, which gave it the new, unpublished dispatch
	// Dispatch (aurora_take_handed, migration 00017: a pending item due one
	// lease later, an expired lease's item published by the relay at once).
	// It has no JetStream message; its claim may take a pending item before
	// it is due.
	Handed bool
}

// claimItem claims one item (a batch of one).
func claimItem(ctx context.Context, db DB, p claimParams) (claimResult, error) {
	rs, err := claimItems(ctx, db, p.Now, p.Exporter, p.Lease, []claimParams{p})
	if err != nil {
		return claimResult{}, err
	}
	return rs[0], nil
}

// claimItems runs claimSQL for ps (item ids must be unique; Now, Exporter
// and Lease are taken from the arguments) and returns one result per
// request, in order.
func claimItems(ctx context.Context, db DB, now *time.Time, exporter string, lease time.Duration, ps []claimParams) ([]claimResult, error) {
	ids := make([]int64, len(ps))
	dispatches := make([]int32, len(ps))
	keys := make([]string, len(ps))
	groups := make([]int64, len(ps))
	handed := make([]bool, len(ps))
	for i, p := range ps {
		ids[i], dispatches[i], keys[i], groups[i], handed[i] = p.ItemID, p.Dispatch, p.Key, p.Group, p.Handed
		if p.Group == 0 {
			groups[i] = -p.ItemID // a group of its own; handleGroup's groups are > 0
		}
	}
	rows, err := db.Query(ctx, claimSQL, now, ids, dispatches, keys, exporter, lease, groups, handed)
	if err != nil {
		return nil, fmt.Errorf("deliverer: claim %d items: %w", len(ps), err)
	}
	defer rows.Close()
	byID := make(map[int64]claimResult, len(ps))
	byReq := make(map[int64]claimParams, len(ps))
	for _, p := range ps {
		byReq[p.ItemID] = p
	}
	for rows.Next() {
		var (
			id                       int64
			r                        claimResult
			found, gotRow, leased    bool
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
			candAccount              *string
		)
		err := rows.Scan(&id,
			&r.Now, &found, &state, &dispatch, &exp, &key, &nextAttempt, &peekLeaseExp,
			&gotRow,
			&leased, &token, &attempts, &firstAttempt, &leaseExp, &account,
			&kind, &mode, &mappingVersion, &quantity, &occurredAt, &periodStart,
			&sc.AccountMode, &sc.AccountConfirmed, &sc.StripeCustomer, &sc.MeterID, &sc.EventName, &sc.CustomerKey, &sc.ValueKey,
			&sc.CurrentMappingVersion, &sc.Watermark, &candAccount)
		if err != nil {
			return nil, fmt.Errorf("deliverer: claim: scan: %w", err)
		}
		p := byReq[id]
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
				ItemID: id, Key: p.Key, LeaseToken: *token, Attempts: *attempts,
				FirstAttemptAt: *firstAttempt, LeaseExpiresAt: *leaseExp, LeasedAt: r.Now, Account: *account,
				Item: checkItem{
					SubjectKind: identity.SubjectKind(*kind), Mode: identity.Mode(*mode), MappingVersion: *mappingVersion,
					Quantity: *quantity, OccurredAt: *occurredAt, PeriodStart: *periodStart,
				},
				Ctx: sc,
			}
		case *exp != exporter || *key != p.Key:
			r.Verdict = verdictMismatch
		case *dispatch != p.Dispatch:
			r.Verdict = verdictStaleDispatch
		case gotRow:
			r.Verdict = verdictSlotBusy
			if candAccount != nil && sc.StripeCustomer != nil && sc.MeterID != nil {
				r.Slot = &slotKey{Account: *candAccount, Customer: *sc.StripeCustomer, Meter: *sc.MeterID}
			}
		case p.Handed && r.State == outbox.StatePending:
			// A handed claim does not wait for next_attempt_at (the take
			// set it one lease ahead): a pending row it did not get was
			// locked by someone else.
			r.Verdict = verdictLocked
		default:
			r.Verdict = stateVerdict(r.State, r.NextAttemptAt, r.LeaseExpiresAt, r.Now)
		}
		byID[id] = r
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("deliverer: claim %d items: %w", len(ps), err)
	}
	out := make([]claimResult, len(ps))
	for i, p := range ps {
		r, ok := byID[p.ItemID]
		if !ok {
			return nil, fmt.Errorf("deliverer: claim: no answer for item %d", p.ItemID)
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
	Now        *time.Time
	Item       claimed
	Outcome    Outcome // never OutcomeStaleLease
	Reason     outbox.Reason
	RetryDelay time.Duration // OutcomeRetry only
	LastError  string        // "" keeps the row's last_error
	Result     Result
}

// recordSQL leaves leased for a batch in one statement (one round trip),
// each row fenced by state = 'leased' AND lease_token = its token: the item
// moves to its state (a retry to pending with next_attempt_at = now + delay
// and dispatch + 1, so the relay publishes a new generation once due); the
// delivery slot is freed if this lease still holds it (slots locked in key
// order, like the claim); the attempt row is written with its outcome, or
// stale_lease when the fenced update matched zero rows (filling in the row
// a takeover wrote, if any). Returns, per record, whether it moved and the
// messages other processes left for the slot it freed (aurora_take_handed,
// called after held locked the slot: migrations 00015 and 00017), each item
// moved to a new dispatch due one lease ($20) later.
//
// Every table is reached by key lookups the planner cannot turn into scans:
// a join on the batch let it answer with hash joins over sequential scans
// of outbox_attempts and delivery_slots — cheap by its estimate on a young
// table, but a cost that grew with every item delivered (22 M tuples read
// by one demo run, pg_stat_user_tables).
const recordSQL = `
WITH clk AS (SELECT coalesce($1::timestamptz, now()) AS now),
rec AS (
    SELECT * FROM unnest($2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::interval[], $7::text[], $8::text[],
                         $9::text[], $10::text[], $11::text[], $12::text[], $13::int[], $14::text[], $15::text[], $16::text[],
                         $17::int[], $18::timestamptz[])
        AS r(id, token, state, reason, delay, last_error, provider_ref, acct, cust, meter, outcome, http_status, request_id, code, msg,
             attempt, started)
),
upd AS (
    UPDATE outbox_items o SET
        state = r.state,
        quarantine_reason = r.reason,
        lease_expires_at = NULL,
        next_attempt_at = CASE WHEN r.state = 'pending' THEN clk.now + r.delay ELSE o.next_attempt_at END,
        dispatch = CASE WHEN r.state = 'pending' THEN o.dispatch + 1 ELSE o.dispatch END,
        last_error = coalesce(r.last_error, o.last_error),
        provider_ref = coalesce(r.provider_ref, o.provider_ref)
    FROM rec r CROSS JOIN clk
    WHERE o.id = r.id AND o.state = 'leased' AND o.lease_token = r.token
    RETURNING o.id
),
held AS (
    -- One primary-key lookup per record (LATERAL), in key order so
    -- concurrent statements lock slots in the same order.
    SELECT r.id, s.tid
    FROM (SELECT * FROM rec WHERE acct IS NOT NULL ORDER BY acct, cust, meter) r
    CROSS JOIN LATERAL (
        SELECT s.ctid AS tid FROM delivery_slots s
        WHERE s.destination_account = r.acct AND s.stripe_customer = r.cust AND s.meter_id = r.meter
          AND s.item_id = r.id AND s.lease_token = r.token
        FOR UPDATE OF s
    ) s
),
rel AS (
    -- By the locked rows' addresses (TID scan): a join on the key was
    -- answered with a sequential scan of delivery_slots.
    UPDATE delivery_slots s SET item_id = NULL, lease_token = 0, expires_at = '-infinity'
    WHERE s.ctid = ANY (ARRAY(SELECT tid FROM held))
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
SELECT r.id, r.id IN (SELECT id FROM upd),
       CASE WHEN h.tid IS NOT NULL THEN aurora_take_handed(r.acct, r.cust, r.meter, $19, $20::interval, clk.now, $2::bigint[]) ELSE '{}' END
FROM rec r CROSS JOIN clk LEFT JOIN held h ON h.id = r.id`

// recordOutcomes writes rs in one statement (item ids unique; now is the
// clock override for all). It returns one error per record (nil, or
// outbox.ErrStaleLease) and, per record, the messages other processes handed
// to the delivery slot that record freed, at most take per slot, oldest
// first (see handOff). Each returned message names its item's new,
// unpublished dispatch (a pending item due lease after now, an item whose
// lease expired published by the relay at once): claimed by this process
// next (claimParams.Handed), or published by the relay when due if this
// process dies first. Items that moved on (delivered, leased by a live
// holder, re-dispatched, or in rs itself) are not returned; an entry that
// does not decode is dropped, its item published when due. The last return
// is a database error for the batch.
func recordOutcomes(ctx context.Context, db DB, now *time.Time, rs []record, take int, lease time.Duration) ([]error, [][]outbox.Message, error) {
	n := len(rs)
	ids, tokens := make([]int64, n), make([]int64, n)
	states, outcomes := make([]string, n), make([]string, n)
	delays := make([]time.Duration, n)
	reasons, lastErrs, refs, accts, custs, meters, reqIDs, codes, msgs := make([]*string, n), make([]*string, n), make([]*string, n),
		make([]*string, n), make([]*string, n), make([]*string, n), make([]*string, n), make([]*string, n), make([]*string, n)
	statuses := make([]*int32, n)
	attempts, started := make([]int32, n), make([]time.Time, n)
	for i, r := range rs {
		ids[i], tokens[i] = r.Item.ItemID, r.Item.LeaseToken
		attempts[i], started[i] = r.Item.Attempts, r.Item.LeasedAt
		states[i], outcomes[i] = string(r.Outcome.nextState()), string(r.Outcome)
		delays[i] = r.RetryDelay
		if r.Outcome == OutcomeQuarantined {
			s := string(r.Reason)
			reasons[i] = &s
		}
		if r.LastError != "" {
			s := truncate(r.LastError, 500)
			lastErrs[i] = &s
		}
		if r.Outcome == OutcomeAccepted && r.Result.ProviderRef != "" {
			s := r.Result.ProviderRef
			refs[i] = &s
		}
		if r.Result.RequestID != "" {
			s := r.Result.RequestID
			reqIDs[i] = &s
		}
		if r.Result.ErrorCode != "" {
			s := r.Result.ErrorCode
			codes[i] = &s
		}
		if r.Result.Message != "" {
			s := truncate(r.Result.Message, 500)
			msgs[i] = &s
		}
		if r.Result.HTTPStatus != 0 {
			st := int32(r.Result.HTTPStatus)
			statuses[i] = &st
		}
		if r.Item.hasSlot() {
			a := r.Item.Account
			accts[i], custs[i], meters[i] = &a, r.Item.Ctx.StripeCustomer, r.Item.Ctx.MeterID
		}
	}
	rows, err := db.Query(ctx, recordSQL, now, ids, tokens, states, reasons, delays, lastErrs, refs,
		accts, custs, meters, outcomes, statuses, reqIDs, codes, msgs, attempts, started, take, lease)
	if err != nil {
		return nil, nil, fmt.Errorf("deliverer: record %d outcomes: %w", n, err)
	}
	type answer struct {
		moved   bool
		waiting [][]byte
	}
	got := make(map[int64]answer, n)
	for rows.Next() {
		var id int64
		var a answer
		if err := rows.Scan(&id, &a.moved, &a.waiting); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("deliverer: record %d outcomes: scan: %w", n, err)
		}
		got[id] = a
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("deliverer: record %d outcomes: %w", n, err)
	}
	out := make([]error, n)
	handed := make([][]outbox.Message, n)
	for i, r := range rs {
		a := got[r.Item.ItemID]
		if !a.moved {
			out[i] = fmt.Errorf("item %d lease_token %d: %w", r.Item.ItemID, r.Item.LeaseToken, outbox.ErrStaleLease)
		}
		for _, raw := range a.waiting {
			// A message that does not decode cannot be claimed: the take
			// gave its item a new dispatch, which the relay publishes when due.
			if m, err := outbox.DecodeMessage(raw); err == nil {
				handed[i] = append(handed[i], m)
			}
		}
	}
	return out, handed, nil
}

// handOffSQL leaves messages for a delivery slot while another lease holds
// it (held, unexpired) and at most $6 would wait for it in all (counted in
// this statement's snapshot: concurrent hand-offs can pass it a little). The key-share
// lock on the slot makes a concurrent release wait for this statement's
// commit, and its aurora_take_handed (a fresh snapshot) sees these rows.
const handOffSQL = `
WITH slot AS MATERIALIZED (
    SELECT 1 FROM delivery_slots s
    WHERE s.destination_account = $1 AND s.stripe_customer = $2 AND s.meter_id = $3
      AND s.item_id IS NOT NULL AND s.expires_at >= coalesce($5::timestamptz, now())
    FOR KEY SHARE
)
INSERT INTO delivery_slot_waiting (destination_account, stripe_customer, meter_id, message, item_id, dispatch, handed_at)
SELECT $1, $2, $3, w.m, w.id, w.d, coalesce($5::timestamptz, now()) FROM unnest($4::bytea[], $7::bigint[], $8::int[]) AS w(m, id, d)
WHERE EXISTS (SELECT 1 FROM slot)
  AND (SELECT count(*) FROM delivery_slot_waiting w
       WHERE w.destination_account = $1 AND w.stripe_customer = $2 AND w.meter_id = $3) + cardinality($4::bytea[]) <= $6`

// requeueSQL makes handed items this process took but will not claim due
// now, so the relay publishes them at once instead of one lease after the
// take: the take gave each a new, unpublished dispatch (migration 00017).
// Only items still pending, unpublished, at the dispatch they were taken
// with move; any other has a newer message or a lease of its own.
//
// The state test is wrapped in IS TRUE so the planner cannot match it to a
// partial index's predicate: it answered a requeue of two items with a scan
// of outbox_items_pending_due_idx, reading the whole pending backlog (100k
// rows, 189 ms in a review's reproduction) — on failure paths, when the
// backlog is largest. Written this way it is one primary-key lookup per item.
const requeueSQL = `
UPDATE outbox_items o SET next_attempt_at = least(o.next_attempt_at, coalesce($3::timestamptz, now()))
FROM unnest($1::bigint[], $2::int[]) AS r(id, dispatch)
WHERE o.id = r.id AND o.dispatch = r.dispatch AND (o.state = 'pending' AND o.published_dispatch < o.dispatch) IS TRUE`

// requeue hands items that were handed to this process (no JetStream
// message) and that it cannot claim back to the relay, due now (now is the
// clock override, nil = the database's), instead of one lease after they
// were taken. It returns how many rows moved.
func requeue(ctx context.Context, db DB, now *time.Time, ms []outbox.Message) (int64, error) {
	ids, dispatches := make([]int64, len(ms)), make([]int32, len(ms))
	for i, m := range ms {
		ids[i], dispatches[i] = m.ItemID, m.Dispatch
	}
	tag, err := db.Exec(ctx, requeueSQL, ids, dispatches, now)
	if err != nil {
		return 0, fmt.Errorf("deliverer: requeue %d handed-off items: %w", len(ms), err)
	}
	return tag.RowsAffected(), nil
}

// handOff gives ms to the live holder of slot: right after the outcome
// write that frees the slot, the holder takes them and claims them next
// (migration 00015). It reports whether the slot took them; false when the
// slot is free or expired by now (claim again) or limit messages already
// wait for it. now is the clock override (nil = the database's).
func handOff(ctx context.Context, db DB, now *time.Time, slot slotKey, ms []outbox.Message, limit int) (bool, error) {
	raw, ids, dispatches := make([][]byte, len(ms)), make([]int64, len(ms)), make([]int32, len(ms))
	for i, m := range ms {
		raw[i], ids[i], dispatches[i] = m.Encode(), m.ItemID, m.Dispatch
	}
	tag, err := db.Exec(ctx, handOffSQL, slot.Account, slot.Customer, slot.Meter, raw, now, limit, ids, dispatches)
	if err != nil {
		return false, fmt.Errorf("deliverer: hand off %d items: %w", len(ms), err)
	}
	return tag.RowsAffected() == int64(len(ms)), nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// isStale reports whether err is outbox.ErrStaleLease.
func isStale(err error) bool { return errors.Is(err, outbox.ErrStaleLease) }
