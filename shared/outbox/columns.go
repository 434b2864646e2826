package outbox

// ColumnWriters says, for every column of outbox_items, which component writes it
// and when. It is the one place this is written down; a test in package
// deliverer fails when the table has a column missing here. Components:
//
//   - stage: Stage, in the caller's transaction (INSERT; the identity and
//     payload are immutable afterwards, enforced by a trigger on any UPDATE
//     that names one of their columns);
//   - trigger: the database's own triggers (key on insert, updated_at on
//     every update);
//   - relay: the relay's publish batch and re-dispatch sweep;
//   - claim, record, defer: the deliverer's claimQuery, recordQuery and
//     deferQuery (deliverer/queries.go);
//   - recovery: an operator's action (requeue, acknowledge, abandon);
//   - reconciler: accepted → confirmed from the provider's evidence.
//
// Every transition out of leased (record) is fenced by state = 'leased' AND
// lease_token; claim is the only writer of leased and of lease_token.
var ColumnWriters = map[string]string{
	"id":                  "stage (identity column)",
	"tenant":              "stage; immutable",
	"subject_kind":        "stage; immutable",
	"subject_ref":         "stage; immutable",
	"exporter":            "stage; immutable",
	"destination_account": "stage; immutable",
	"mode":                "stage; immutable",
	"mapping_version":     "stage; immutable",
	"idempotency_key":     "trigger on insert (aurora_idempotency_key of the identity); immutable",
	"feature":             "stage; immutable",
	"quantity":            "stage; immutable",
	"occurred_at":         "stage; immutable",
	"period_start":        "stage; immutable",
	"payload":             "stage; immutable",
	"state":               "stage (pending); claim (leased); record (pending on retry, or a terminal state); recovery (pending from quarantined, accepted or rejected from uncertain); reconciler (confirmed)",
	"quarantine_reason":   "record (set with quarantined, cleared otherwise); recovery requeue (cleared)",
	"lease_token":         "claim (+1 on every lease); never decreases",
	"lease_expires_at":    "claim (now + lease); record and recovery requeue (cleared)",
	"attempts":            "claim (+1 on every lease)",
	"next_attempt_at":     "stage (now); record (now + backoff on retry); defer (later, for a lane over its share); recall (now, once the deferring lane has room); recovery requeue (now)",
	"first_attempt_at":    "claim (the first lease's now; kept afterwards)",
	"dispatch":            "record (+1 on retry); defer (+1); relay sweep (+1 for a message presumed lost); recovery requeue (+1)",
	"published_dispatch":  "relay (the dispatch JetStream acknowledged)",
	"published_at":        "relay (when it was acknowledged)",
	"last_error":          "record (the failure, at most 500 bytes cut on a UTF-8 boundary; kept when an outcome has none)",
	"provider_ref":        "record (the provider's reference on accepted); recovery acknowledge (the operator's evidence)",
	"created_at":          "stage (default now())",
	"updated_at":          "now() on every update but the relay's mark (published_* only, migration 00308), which keeps it; claim and record write now() themselves, the trigger sets it for every other writer (migration 00309)",
	"leased_at":           "claim (the lease's now: the attempt's started_at)",
	"finished":            "Postgres (stored generated column, migration 00311): state is confirmed, rejected or quarantined; indexed in place of state so claims and outcomes stay heap-only updates",
	"uncertain_since":     "Postgres (stored generated column, migration 00311): updated_at while state is uncertain, else NULL",
}
