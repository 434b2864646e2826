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
}

// claimSQL claims one item by id in one statement (one round trip):
//
//   - peek reads the row as it was (for the verdict when nothing is claimed);
//   - cand locks it with FOR UPDATE SKIP LOCKED if it is claimable: the
//     message's dispatch, exporter and key, and pending-and-due or
//     leased-with-expired-lease, by the clock $1;
//   - ctx reads its account, customer, mapping and cutover watermark;
//   - slot takes the (account, customer, meter) delivery slot when it is free
//     or expired (ON CONFLICT … DO UPDATE … WHERE expires_at < now);
//   - upd leases the row (lease_token+1, attempts+1, first_attempt_at,
//     lease_expires_at = now + lease) unless the slot was needed and busy;
//   - att opens the attempt row (outcome NULL until recorded).
const claimSQL = `
WITH clk AS (SELECT coalesce($1::timestamptz, now()) AS now),
peek AS (
    SELECT id, state, dispatch, exporter, idempotency_key, next_attempt_at, lease_expires_at
    FROM outbox_items WHERE id = $2
),
cand AS MATERIALIZED (
    SELECT i.id, i.tenant, i.destination_account, i.feature, i.lease_token
    FROM outbox_items i, clk
    WHERE i.id = $2 AND i.dispatch = $3 AND i.exporter = $4 AND i.idempotency_key = $5
      AND ((i.state = 'pending' AND i.next_attempt_at <= clk.now)
        OR (i.state = 'leased' AND i.lease_expires_at < clk.now))
    FOR UPDATE OF i SKIP LOCKED
),
ctx AS MATERIALIZED (
    SELECT c.id, a.mode AS account_mode, a.confirmed AS account_confirmed, b.stripe_customer,
           m.meter_id, m.event_name, m.customer_key, m.value_key, m.mapping_version AS current_mapping_version,
           w.watermark
    FROM cand c
    LEFT JOIN stripe_accounts a ON a.account_id = c.destination_account
    LEFT JOIN tenant_billing b ON b.tenant = c.tenant AND b.destination_account = c.destination_account
    LEFT JOIN meter_mappings m ON m.destination_account = c.destination_account AND m.feature = c.feature
    LEFT JOIN LATERAL (
        SELECT u.watermark FROM usage_cutovers u
        WHERE u.feature = c.feature AND u.tenant IN (c.tenant, '')
        ORDER BY u.tenant = '' LIMIT 1
    ) w ON true
),
slot AS (
    INSERT INTO delivery_slots AS s (destination_account, stripe_customer, meter_id, item_id, lease_token, expires_at)
    SELECT c.destination_account, x.stripe_customer, x.meter_id, c.id, c.lease_token + 1, clk.now + $6::interval
    FROM cand c JOIN ctx x ON x.id = c.id CROSS JOIN clk
    WHERE x.stripe_customer IS NOT NULL AND x.meter_id IS NOT NULL
    ON CONFLICT (destination_account, stripe_customer, meter_id) DO UPDATE
        SET item_id = excluded.item_id, lease_token = excluded.lease_token, expires_at = excluded.expires_at
        WHERE s.expires_at < coalesce($1::timestamptz, now())
    RETURNING s.item_id
),
upd AS (
    UPDATE outbox_items o SET
        state = 'leased',
        lease_token = o.lease_token + 1,
        attempts = o.attempts + 1,
        first_attempt_at = coalesce(o.first_attempt_at, clk.now),
        lease_expires_at = clk.now + $6::interval
    FROM cand c JOIN ctx x ON x.id = c.id CROSS JOIN clk
    WHERE o.id = c.id
      AND (x.stripe_customer IS NULL OR x.meter_id IS NULL OR EXISTS (SELECT 1 FROM slot))
    RETURNING o.id, o.lease_token, o.attempts, o.first_attempt_at, o.lease_expires_at, o.destination_account,
              o.subject_kind, o.mode, o.mapping_version, o.quantity, o.occurred_at, o.period_start
),
att AS (
    INSERT INTO outbox_attempts (item_id, attempt, lease_token, started_at)
    SELECT u.id, u.attempts, u.lease_token, clk.now FROM upd u CROSS JOIN clk
)
SELECT clk.now, p.id IS NOT NULL, p.state, p.dispatch, p.exporter, p.idempotency_key, p.next_attempt_at, p.lease_expires_at,
       EXISTS (SELECT 1 FROM cand),
       u.id IS NOT NULL, u.lease_token, u.attempts, u.first_attempt_at, u.lease_expires_at, u.destination_account,
       u.subject_kind, u.mode, u.mapping_version, u.quantity, u.occurred_at, u.period_start,
       x.account_mode, x.account_confirmed, x.stripe_customer, x.meter_id, x.event_name, x.customer_key, x.value_key,
       x.current_mapping_version, x.watermark
FROM clk
LEFT JOIN peek p ON true
LEFT JOIN upd u ON true
LEFT JOIN ctx x ON true`

// claimParams names the message and the lease to take.
type claimParams struct {
	Now      *time.Time // clock override; nil = database now()
	ItemID   int64
	Dispatch int32
	Exporter string
	Key      string
	Lease    time.Duration
}

// claimItem runs claimSQL and decides the verdict.
func claimItem(ctx context.Context, db DB, p claimParams) (claimResult, error) {
	var (
		r                        claimResult
		found, gotRow, leased    bool
		state, exporter, key     *string
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
	)
	err := db.QueryRow(ctx, claimSQL, p.Now, p.ItemID, p.Dispatch, p.Exporter, p.Key, p.Lease).Scan(
		&r.Now, &found, &state, &dispatch, &exporter, &key, &nextAttempt, &peekLeaseExp,
		&gotRow,
		&leased, &token, &attempts, &firstAttempt, &leaseExp, &account,
		&kind, &mode, &mappingVersion, &quantity, &occurredAt, &periodStart,
		&sc.AccountMode, &sc.AccountConfirmed, &sc.StripeCustomer, &sc.MeterID, &sc.EventName, &sc.CustomerKey, &sc.ValueKey,
		&sc.CurrentMappingVersion, &sc.Watermark)
	if err != nil {
		return claimResult{}, fmt.Errorf("deliverer: claim item %d: %w", p.ItemID, err)
	}
	if !found {
		r.Verdict = verdictNotFound
		return r, nil
	}
	r.State = outbox.State(*state)
	r.NextAttemptAt = *nextAttempt
	r.LeaseExpiresAt = peekLeaseExp
	switch {
	case leased:
		r.Verdict = verdictClaimed
		r.Item = claimed{
			ItemID: p.ItemID, Key: p.Key, LeaseToken: *token, Attempts: *attempts,
			FirstAttemptAt: *firstAttempt, LeaseExpiresAt: *leaseExp, Account: *account,
			Item: checkItem{
				SubjectKind: identity.SubjectKind(*kind), Mode: identity.Mode(*mode), MappingVersion: *mappingVersion,
				Quantity: *quantity, OccurredAt: *occurredAt, PeriodStart: *periodStart,
			},
			Ctx: sc,
		}
	case *exporter != p.Exporter || *key != p.Key:
		r.Verdict = verdictMismatch
	case *dispatch != p.Dispatch:
		r.Verdict = verdictStaleDispatch
	case gotRow:
		r.Verdict = verdictSlotBusy
	default:
		r.Verdict = stateVerdict(r.State, r.NextAttemptAt, r.LeaseExpiresAt, r.Now)
	}
	return r, nil
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

// recordSQL leaves leased in one statement (one round trip), fenced by
// state = 'leased' AND lease_token = $3: the item moves to $4 (a retry to
// pending with next_attempt_at = now + $6 and dispatch + 1, so the relay
// publishes a new generation once due); the delivery slot is freed if this
// lease still holds it; the attempt row gets its outcome, or stale_lease when
// the fenced update matched zero rows. Returns whether the item moved.
const recordSQL = `
WITH clk AS (SELECT coalesce($1::timestamptz, now()) AS now),
upd AS (
    UPDATE outbox_items o SET
        state = $4,
        quarantine_reason = $5,
        lease_expires_at = NULL,
        next_attempt_at = CASE WHEN $4 = 'pending' THEN clk.now + $6::interval ELSE o.next_attempt_at END,
        dispatch = CASE WHEN $4 = 'pending' THEN o.dispatch + 1 ELSE o.dispatch END,
        last_error = coalesce($7, o.last_error),
        provider_ref = coalesce($8, o.provider_ref)
    FROM clk
    WHERE o.id = $2 AND o.state = 'leased' AND o.lease_token = $3
    RETURNING o.id
),
rel AS (
    UPDATE delivery_slots s SET item_id = NULL, lease_token = 0, expires_at = '-infinity'
    WHERE s.destination_account = $9 AND s.stripe_customer = $10 AND s.meter_id = $11
      AND s.item_id = $2 AND s.lease_token = $3
),
att AS (
    UPDATE outbox_attempts a SET
        finished_at = clk.now,
        outcome = CASE WHEN EXISTS (SELECT 1 FROM upd) THEN $12 ELSE 'stale_lease' END,
        http_status = $13, stripe_request_id = $14, error_code = $15, error_message = $16
    FROM clk
    WHERE a.item_id = $2 AND a.lease_token = $3
)
SELECT EXISTS (SELECT 1 FROM upd)`

// recordOutcome writes r. A fenced update of zero rows returns
// outbox.ErrStaleLease (the attempt row says stale_lease; nothing else
// changed).
func recordOutcome(ctx context.Context, db DB, r record) error {
	var reason, lastErr, ref, reqID, code, msg *string
	if r.Outcome == OutcomeQuarantined {
		s := string(r.Reason)
		reason = &s
	}
	if r.LastError != "" {
		s := truncate(r.LastError, 500)
		lastErr = &s
	}
	if r.Outcome == OutcomeAccepted && r.Result.ProviderRef != "" {
		ref = &r.Result.ProviderRef
	}
	if r.Result.RequestID != "" {
		reqID = &r.Result.RequestID
	}
	if r.Result.ErrorCode != "" {
		code = &r.Result.ErrorCode
	}
	if r.Result.Message != "" {
		s := truncate(r.Result.Message, 500)
		msg = &s
	}
	var status *int
	if r.Result.HTTPStatus != 0 {
		status = &r.Result.HTTPStatus
	}
	var acct, cust, meter *string
	if r.Item.hasSlot() {
		acct, cust, meter = &r.Item.Account, r.Item.Ctx.StripeCustomer, r.Item.Ctx.MeterID
	}
	var moved bool
	err := db.QueryRow(ctx, recordSQL, r.Now, r.Item.ItemID, r.Item.LeaseToken,
		string(r.Outcome.nextState()), reason, r.RetryDelay, lastErr, ref,
		acct, cust, meter,
		string(r.Outcome), status, reqID, code, msg).Scan(&moved)
	if err != nil {
		return fmt.Errorf("deliverer: record outcome of item %d: %w", r.Item.ItemID, err)
	}
	if !moved {
		return fmt.Errorf("item %d lease_token %d: %w", r.Item.ItemID, r.Item.LeaseToken, outbox.ErrStaleLease)
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// isStale reports whether err is outbox.ErrStaleLease.
func isStale(err error) bool { return errors.Is(err, outbox.ErrStaleLease) }
