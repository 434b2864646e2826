package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
)

// producer plays the application: it stages Items usage events at an even
// pace over StageFor, through the usage gate in transactions of a tick's
// worth, HotShare of them for the hot tenants, CorrectionShare of them
// corrections of earlier events (events). A batch whose transaction
// fails is retried as it is (recording is idempotent by event id), so an
// interrupted commit never loses nor doubles an event.
type producer struct {
	r *run

	mu        sync.Mutex
	n         int
	committed int64 // quantity staged
}

func (p *producer) staged() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// Corrections the producer stages (Options.CorrectionShare of the items)
// name an event staged between correctionLag[0] and correctionLag[1] items
// earlier, of the same tenant: by then it is usually accepted, sometimes
// still open (the correction then waits for it).
var correctionLag = [2]int{200, 2000}

// events returns the run's events, deterministic in the seed. With
// Options.CorrectionShare, that share of them (after the first
// correctionLag[0]) are corrections of an earlier plain event: half
// negative (−d, 1 ≤ d ≤ its quantity: Stripe's record is cancelled and the
// rest restated; at most one negative correction per event, so chains stay
// linear), half positive (+1..+20, a compensating event).
func (p *producer) events(now time.Time) []usage.Event {
	o := p.r.o
	rng := rand.New(rand.NewPCG(o.Seed, 0x70726f64)) // "prod"
	evs := make([]usage.Event, o.Items)
	cancelled := map[int]bool{} // plain events a negative correction names
	for i := range evs {
		id := fmt.Sprintf("chaos-%d-%06d", o.Seed, i)
		if i >= correctionLag[0] && rng.Float64() < o.CorrectionShare {
			j := i - correctionLag[0] - rng.IntN(min(i, correctionLag[1])-correctionLag[0]+1)
			if t := evs[j]; t.CorrectsEventID == "" {
				c := usage.Event{Tenant: t.Tenant, EventID: id, Feature: feature, OccurredAt: now, CorrectsEventID: t.EventID,
					Quantity: 1 + rng.Int64N(20)}
				if rng.IntN(2) == 0 && !cancelled[j] {
					cancelled[j] = true
					c.Quantity = -(1 + rng.Int64N(t.Quantity))
				}
				evs[i] = c
				continue
			}
		}
		var tenant string
		if rng.Float64() < o.HotShare {
			tenant = p.r.hot[rng.IntN(len(p.r.hot))]
		} else {
			tenant = p.r.cold[rng.IntN(len(p.r.cold))]
		}
		evs[i] = usage.Event{Tenant: tenant, EventID: id, Feature: feature,
			Quantity: 1 + rng.Int64N(100), OccurredAt: now}
	}
	return evs
}

func (p *producer) run(ctx context.Context) error {
	o := p.r.o
	began := time.Now()
	evs := p.events(began.UTC().Truncate(time.Second))
	gate := usage.Gate{
		Recorder: usage.Recorder{DestinationAccount: account, Mode: identity.ModeTest, Period: usage.PeriodDay},
		Sources:  usage.Sources{feature: usage.SourceEvents},
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	next := 0
	for next < len(evs) {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		due := int(float64(len(evs)) * float64(time.Since(began)) / float64(o.StageFor))
		due = min(max(due, next), len(evs))
		for next < due {
			end := min(due, next+200)
			batch := evs[next:end]
			for attempt := 0; ; attempt++ {
				err := pgx.BeginFunc(ctx, p.r.pool, func(tx pgx.Tx) error {
					if _, err := gate.RecordBatch(ctx, tx, batch); err != nil {
						return err
					}
					return p.r.publishInvoices(ctx, tx, next, batch) // events.go
				})
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					return nil
				}
				if attempt >= 50 {
					return fmt.Errorf("chaos: producer: staging failed 50 times: %w", err)
				}
				time.Sleep(200 * time.Millisecond)
			}
			var q int64
			for _, e := range batch {
				q += e.Quantity
			}
			p.mu.Lock()
			p.n += len(batch)
			p.committed += q
			p.mu.Unlock()
			next = end
		}
	}
	return nil
}
