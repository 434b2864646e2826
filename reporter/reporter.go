package reporter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults of Config.
const (
	IntervalSecondsDefault = 60
	BatchSizeDefault       = 500
	WorkersDefault         = 4
)

// Config is the reporter's configuration (AURORA_* variables).
type Config struct {
	// IntervalSeconds between passes. AURORA_REPORTER_INTERVAL_SECONDS,
	// defaults to 60, 1..86400.
	IntervalSeconds int `env:"REPORTER_INTERVAL_SECONDS" envDefault:"60"`
	// BatchSize: counters read per query within a pass (each period is
	// still its own transaction). AURORA_REPORTER_BATCH_SIZE, defaults to
	// 500, 1..10000.
	BatchSize int `env:"REPORTER_BATCH_SIZE" envDefault:"500"`
	// Workers: periods handled concurrently within a batch, each in its own
	// transaction (one pooled connection each). AURORA_REPORTER_WORKERS,
	// defaults to 4, 1..64.
	Workers int `env:"REPORTER_WORKERS" envDefault:"4"`
	// FeatureSources: where each feature's quantity comes from,
	// "feature:counters|events,…" (usage.ParseSources); unlisted features
	// count. AURORA_FEATURE_SOURCES, defaults to empty. Deployed separately
	// from the cutover watermark (seed 000: two decisions).
	FeatureSources string `env:"FEATURE_SOURCES"`
}

// Validate checks the ranges and the syntax of FeatureSources, naming the
// variable (*config.RangeError, config.ErrInvalid).
func (c Config) Validate() error {
	var src error
	if _, err := usage.ParseSources(c.FeatureSources); err != nil {
		src = &config.RangeError{Var: config.Prefix + "FEATURE_SOURCES", Value: c.FeatureSources,
			Allowed: "comma-separated feature:counters|events (" + err.Error() + ")"}
	}
	return errors.Join(
		config.IntRange("REPORTER_INTERVAL_SECONDS", c.IntervalSeconds, 1, 86400, "seconds"),
		config.IntRange("REPORTER_BATCH_SIZE", c.BatchSize, 1, 10000, "rows"),
		config.IntRange("REPORTER_WORKERS", c.Workers, 1, 64, "concurrent periods"),
		src)
}

// Sources returns the parsed FeatureSources (call Validate first).
func (c Config) Sources() usage.Sources {
	s, _ := usage.ParseSources(c.FeatureSources)
	return s
}

// Interval returns IntervalSeconds as a duration.
func (c Config) Interval() time.Duration { return time.Duration(c.IntervalSeconds) * time.Second }

// ErrDrift is wrapped by *DriftError.
var ErrDrift = errors.New("reporter: drift")

// DriftError: a counter is below the position its ledger claims was
// reported, which counters that only grow cannot produce (seed 000,
// "Reconciliation": local drift). Nothing is staged for the period.
type DriftError struct {
	Tenant, Feature string
	PeriodStart     time.Time
	Count           int64 // usage_counters.count
	AcknowledgedTo  int64 // usage_windows.acknowledged_to
}

func (e *DriftError) Error() string {
	return fmt.Sprintf("reporter: drift: %s %s: count %d is below acknowledged_to %d",
		e.Feature, e.PeriodStart.UTC().Format(time.RFC3339), e.Count, e.AcknowledgedTo)
}

// Unwrap returns ErrDrift.
func (e *DriftError) Unwrap() error { return ErrDrift }

// ErrWindowCorrupt: the staged item linked from usage_windows is not a
// window of that period, or restaging it did not collapse onto it. Nothing
// was written.
var ErrWindowCorrupt = errors.New("reporter: window_corrupt")

// Reporter stages buffered usage windows. Fields are read-only after the
// first call.
type Reporter struct {
	Pool     *pgxpool.Pool
	Recorder usage.Recorder // destination account, mode, period and exporter of staged windows
	Sources  usage.Sources  // nil = every feature counts
	Clock    clock.Clock    // nil = the database clock
	// BatchSize: counters read per query. Defaults to BatchSizeDefault.
	BatchSize int
	// Workers: periods handled concurrently. Defaults to WorkersDefault.
	Workers int
	Logger  *slog.Logger // nil = slog.Default()
	Metrics *Metrics     // nil = no metrics
}

// Outcome is what ReportPeriod did for one period.
type Outcome string

const (
	// OutcomeStaged: a new window item was staged and linked.
	OutcomeStaged Outcome = "staged"
	// OutcomeOpen: the linked window is unresolved; it was restaged onto
	// the same row and left alone.
	OutcomeOpen Outcome = "open"
	// OutcomeIdle: nothing to stage (the count equals the acknowledged
	// position), possibly after advancing the ledger.
	OutcomeIdle Outcome = "idle"
	// OutcomeRecording: the period belongs to the recording era; nothing
	// staged.
	OutcomeRecording Outcome = "recording"
)

// PeriodResult is ReportPeriod's answer.
type PeriodResult struct {
	Outcome  Outcome
	Advanced bool       // the ledger advanced past an accepted window first
	Window   outbox.Row // the staged or open window (zero for idle, recording)
}

func (r *Reporter) logger() *slog.Logger {
	if r.Logger == nil {
		return slog.Default()
	}
	return r.Logger
}

func (r *Reporter) batchSize() int {
	if r.BatchSize <= 0 {
		return BatchSizeDefault
	}
	return r.BatchSize
}

func (r *Reporter) workers() int {
	if r.Workers <= 0 {
		return WorkersDefault
	}
	return r.Workers
}

func (r *Reporter) exporter() string {
	if r.Recorder.Exporter == "" {
		return outbox.DefaultExporter
	}
	return r.Recorder.Exporter
}

func (r *Reporter) period() usage.Period {
	if !r.Recorder.Period.Valid() {
		return usage.PeriodDay
	}
	return r.Recorder.Period
}

// ReportPeriod brings the window of (tenant, feature, the period starting at
// periodStart) up to date in one transaction (see the package
// documentation). Errors: *DriftError (ErrDrift), ErrWindowCorrupt
// (wrapped), outbox.ErrPayloadConflict (an identity would be re-pointed;
// nothing written), or a database error.
func (r *Reporter) ReportPeriod(ctx context.Context, tenant, feature string, periodStart time.Time) (PeriodResult, error) {
	var res PeriodResult
	periodStart = periodStart.UTC()
	err := pgx.BeginFunc(ctx, r.Pool, func(tx pgx.Tx) error {
		var err error
		res, err = r.reportPeriod(ctx, tx, tenant, feature, periodStart)
		return err
	})
	if err != nil {
		return PeriodResult{}, err
	}
	return res, nil
}

func (r *Reporter) reportPeriod(ctx context.Context, tx pgx.Tx, tenant, feature string, periodStart time.Time) (PeriodResult, error) {
	w, scheduled, err := usage.LockedWatermarkFor(ctx, tx, tenant, feature)
	if err != nil {
		return PeriodResult{}, err
	}
	if usage.EraOf(periodStart, w, scheduled, r.Sources.Of(feature)) != usage.EraBuffered {
		return PeriodResult{Outcome: OutcomeRecording}, nil
	}
	// One round trip: make sure the ledger row exists, lock it and read the
	// counter, and read the timestamp and mapping version a new window
	// would carry.
	var ackTo, count int64
	var generation int
	var stagedID *int64
	var occurredAt time.Time
	var version int32
	b := &pgx.Batch{}
	b.Queue(`
		INSERT INTO usage_windows (tenant, feature, period_start) VALUES ($1, $2, $3)
		ON CONFLICT (tenant, feature, period_start) DO NOTHING`, tenant, feature, periodStart)
	b.Queue(`
		SELECT w.acknowledged_to, w.generation, w.staged_item_id, coalesce(c.count, 0)
		FROM usage_windows w
		LEFT JOIN usage_counters c USING (tenant, feature, period_start)
		WHERE w.tenant = $1 AND w.feature = $2 AND w.period_start = $3
		FOR UPDATE OF w`, tenant, feature, periodStart).QueryRow(func(row pgx.Row) error {
		return row.Scan(&ackTo, &generation, &stagedID, &count)
	})
	b.Queue(`
		SELECT date_trunc('second', least($1::timestamptz, coalesce($2::timestamptz, now()))),
		       coalesce((SELECT mapping_version FROM meter_mappings WHERE destination_account = $3 AND feature = $4), 0)`,
		r.period().End(periodStart).Add(-time.Second), clock.Or(r.Clock).Override(), r.Recorder.DestinationAccount, feature).
		QueryRow(func(row pgx.Row) error { return row.Scan(&occurredAt, &version) })
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return PeriodResult{}, fmt.Errorf("reporter: lock window: %w", err)
	}
	var res PeriodResult
	if stagedID != nil {
		staged, err := outbox.Get(ctx, tx, *stagedID)
		if err != nil {
			return PeriodResult{}, err
		}
		from, to, g, ok := usage.WindowBounds(staged.SubjectRef, feature, periodStart)
		if !ok || staged.SubjectKind != identity.SubjectUsageWindow || staged.Tenant != tenant || from != ackTo || g != generation {
			return PeriodResult{}, fmt.Errorf("%w: item %d is not the open window of this period", ErrWindowCorrupt, staged.ID)
		}
		switch staged.State {
		case outbox.StateAccepted, outbox.StateConfirmed:
			if _, err := tx.Exec(ctx, `
				UPDATE usage_windows SET acknowledged_to = $4, staged_item_id = NULL, updated_at = now()
				WHERE tenant = $1 AND feature = $2 AND period_start = $3`, tenant, feature, periodStart, to); err != nil {
				return PeriodResult{}, fmt.Errorf("reporter: advance: %w", err)
			}
			ackTo, res.Advanced = to, true
		case outbox.StatePending, outbox.StateLeased, outbox.StateUncertain, outbox.StateQuarantined, outbox.StateRejected:
			// Unresolved (or rejected by the provider and still linked,
			// which only an operator resolves): restage the same window —
			// same bounds, same generation, same stored payload — which
			// collapses onto the same row, and leave it alone.
			again, err := outbox.Stage(ctx, tx, windowItem(staged, tenant, feature, periodStart, from, to, g))
			if err != nil {
				return PeriodResult{}, err
			}
			if again.ID != staged.ID {
				return PeriodResult{}, fmt.Errorf("%w: restaging item %d produced item %d", ErrWindowCorrupt, staged.ID, again.ID)
			}
			return PeriodResult{Outcome: OutcomeOpen, Window: again}, nil
		default:
			return PeriodResult{}, fmt.Errorf("reporter: item %d has unknown state %q", staged.ID, staged.State)
		}
	}
	switch {
	case count < ackTo:
		return PeriodResult{}, &DriftError{Tenant: tenant, Feature: feature, PeriodStart: periodStart, Count: count, AcknowledgedTo: ackTo}
	case count == ackTo:
		res.Outcome = OutcomeIdle
		return res, nil
	}
	row, err := outbox.Stage(ctx, tx, outbox.Item{
		Identity: identity.Identity{
			Tenant: tenant, SubjectKind: identity.SubjectUsageWindow,
			SubjectRef: usage.WindowSubjectRef(feature, periodStart, ackTo, count, generation),
			Exporter:   r.exporter(), DestinationAccount: r.Recorder.DestinationAccount, Mode: r.Recorder.Mode,
			MappingVersion: version,
		},
		Feature: feature, Quantity: count - ackTo, OccurredAt: occurredAt, PeriodStart: periodStart,
	})
	if err != nil {
		return PeriodResult{}, err
	}
	if _, err := tx.Exec(ctx, `
		UPDATE usage_windows SET staged_item_id = $4, updated_at = now()
		WHERE tenant = $1 AND feature = $2 AND period_start = $3`, tenant, feature, periodStart, row.ID); err != nil {
		return PeriodResult{}, fmt.Errorf("reporter: link window: %w", err)
	}
	res.Outcome, res.Window = OutcomeStaged, row
	return res, nil
}

// windowItem rebuilds the item of a staged window from its bounds and the
// payload fixed when it was first staged (occurred_at, mapping version,
// destination), so a restage is byte-identical.
func windowItem(staged outbox.Row, tenant, feature string, periodStart time.Time, from, to int64, g int) outbox.Item {
	return outbox.Item{
		Identity: identity.Identity{
			Tenant: tenant, SubjectKind: identity.SubjectUsageWindow,
			SubjectRef: usage.WindowSubjectRef(feature, periodStart, from, to, g),
			Exporter:   staged.Exporter, DestinationAccount: staged.DestinationAccount, Mode: staged.Mode,
			MappingVersion: staged.MappingVersion,
		},
		Feature: feature, Quantity: to - from, OccurredAt: staged.OccurredAt, PeriodStart: periodStart,
		Payload: staged.Payload,
	}
}

// PassResult counts what one pass did.
type PassResult struct {
	Examined  int // periods looked at
	Staged    int // new windows staged
	Advanced  int // ledgers advanced past an accepted window
	Open      int // windows still unresolved (restaged onto their row)
	Recording int // periods of the recording era (skipped)
	Drift     int // periods with a count below the acknowledged position
	Failed    int // periods whose transaction failed (other errors)
}

// Pass walks every counter that may need a window — its count differs from
// the acknowledged position or a window is linked, and its period starts
// before the governing watermark if any — in key order, batch by batch,
// each period in its own transaction, Workers periods at a time (periods
// are independent: each locks its own usage_windows row). A failing period is logged (no
// payload, no customer data), counted and skipped; the pass goes on and
// returns the first such error wrapped, with the counts.
func (r *Reporter) Pass(ctx context.Context) (PassResult, error) {
	var res PassResult
	var firstErr error
	var afterTenant, afterFeature string
	afterStart := time.Time{}
	for {
		type key struct {
			tenant, feature string
			start           time.Time
		}
		rows, err := r.Pool.Query(ctx, `
			SELECT c.tenant, c.feature, c.period_start
			FROM usage_counters c
			LEFT JOIN usage_windows w USING (tenant, feature, period_start)
			LEFT JOIN LATERAL (
				SELECT u.watermark FROM usage_cutovers u
				WHERE u.feature = c.feature AND u.tenant IN (c.tenant, '')
				ORDER BY u.tenant = '' LIMIT 1) cw ON true
			WHERE (c.tenant, c.feature, c.period_start) > ($1, $2, $3)
			  AND (w.staged_item_id IS NOT NULL OR c.count <> coalesce(w.acknowledged_to, 0))
			  AND (cw.watermark IS NULL OR c.period_start < cw.watermark)
			ORDER BY c.tenant, c.feature, c.period_start
			LIMIT $4`, afterTenant, afterFeature, afterStart, r.batchSize())
		if err != nil {
			return res, fmt.Errorf("reporter: select counters: %w", err)
		}
		keys, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (key, error) {
			var k key
			err := row.Scan(&k.tenant, &k.feature, &k.start)
			return k, err
		})
		if err != nil {
			return res, fmt.Errorf("reporter: select counters: %w", err)
		}
		var mu sync.Mutex
		work := make(chan key)
		var wg sync.WaitGroup
		for range min(r.workers(), max(len(keys), 1)) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := range work {
					pr, err := r.ReportPeriod(ctx, k.tenant, k.feature, k.start)
					if ctx.Err() != nil {
						continue // shutting down: not a failure of the period
					}
					mu.Lock()
					r.tally(&res, &firstErr, k.feature, k.start, pr, err)
					mu.Unlock()
				}
			}()
		}
		for _, k := range keys {
			if ctx.Err() != nil {
				break
			}
			work <- k
		}
		close(work)
		wg.Wait()
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if len(keys) < r.batchSize() {
			break
		}
		last := keys[len(keys)-1]
		afterTenant, afterFeature, afterStart = last.tenant, last.feature, last.start
	}
	r.Metrics.observe(res)
	if firstErr != nil {
		return res, fmt.Errorf("reporter: pass: %d period(s) failed: %w", res.Drift+res.Failed, firstErr)
	}
	return res, nil
}

// tally adds one period's result to res (the caller holds the lock).
func (r *Reporter) tally(res *PassResult, firstErr *error, feature string, start time.Time, pr PeriodResult, err error) {
	res.Examined++
	var drift *DriftError
	switch {
	case errors.As(err, &drift):
		res.Drift++
		r.logger().Error("reporter: counter below acknowledged position; nothing staged",
			"feature", feature, "period_start", start, "count", drift.Count, "acknowledged_to", drift.AcknowledgedTo)
	case err != nil:
		res.Failed++
		r.logger().Error("reporter: period failed", "feature", feature, "period_start", start, "error", err)
	}
	if err != nil {
		if *firstErr == nil {
			*firstErr = err
		}
		return
	}
	if pr.Advanced {
		res.Advanced++
	}
	switch pr.Outcome {
	case OutcomeStaged:
		res.Staged++
	case OutcomeOpen:
		res.Open++
	case OutcomeRecording:
		res.Recording++
	case OutcomeIdle:
	}
}

// Run runs a pass, then one every interval, until ctx ends (returns nil).
// A failed pass is logged and the loop goes on.
func (r *Reporter) Run(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("reporter: interval must be > 0, got %s", interval)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		res, err := r.Pass(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			r.logger().Error("reporter: pass", "error", err)
		}
		if res.Examined > 0 {
			r.logger().Info("reporter: pass", "examined", res.Examined, "staged", res.Staged, "advanced", res.Advanced,
				"open", res.Open, "recording", res.Recording, "drift", res.Drift, "failed", res.Failed)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
