package stripeemulator_test

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/aurora-billing/aurora/stripeemulator"
	stripe "github.com/stripe/stripe-go/v76"
)

// TestConcurrentRetriesApplyOnce hammers the emulator from many goroutines
// with faults on, each item retried with the same key and body until
// accepted (200 or the duplicate 400), with 1–3 ms latency so calls for one
// customer overlap: every item is applied exactly once,
// and the totals match.
func TestConcurrentRetriesApplyOnce(t *testing.T) {
	t.Parallel()
	f, err := stripeemulator.ParseFaults("drop-after-apply=0.2,http500=0.15,http429=0.1,latency=1ms-3ms")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, stripeemulator.Config{Faults: f, Seed: 42})
	customers := []string{custA, custB, "cus_C", "cus_D"}
	for _, c := range customers[2:] {
		if err := e.emu.AddCustomer(c); err != nil {
			t.Fatal(err)
		}
	}
	sc := stripeClient(e.srv.URL, testKey, noKeepAlive())
	type item struct{ id, cust string }
	items := make(chan item)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range items {
				ok := false
				for range 200 {
					_, err := sc.BillingMeterEvents.New(event(it.id, it.cust, "1", epoch))
					var se *stripe.Error
					if err == nil || (errors.As(err, &se) && strings.HasPrefix(se.Msg, stripeemulator.DuplicateIdentifierMessagePrefix)) {
						ok = true
						break
					}
				}
				if !ok {
					mu.Lock()
					failures = append(failures, it.id)
					mu.Unlock()
				}
			}
		}()
	}
	const perCustomer = 50
	for i := range perCustomer {
		for _, c := range customers {
			items <- item{id: c + "-" + itoa(int64(i)), cust: c}
		}
	}
	close(items)
	wg.Wait()
	if len(failures) != 0 {
		t.Fatalf("items never accepted: %v", failures)
	}
	if d := e.emu.DuplicateApplications(); len(d) != 0 {
		t.Fatalf("applied twice: %v", d)
	}
	if n := len(e.emu.Applied()); n != perCustomer*len(customers) {
		t.Fatalf("want %d applied, got %d", perCustomer*len(customers), n)
	}
	if tot := e.emu.AppliedTotals()[eventName]; tot != perCustomer*float64(len(customers)) {
		t.Fatalf("total %v", tot)
	}
	c := e.emu.Counts()
	if c[stripeemulator.OutcomeDropped] == 0 || c[stripeemulator.OutcomeServerError] == 0 || c[stripeemulator.OutcomeOverlap] == 0 {
		t.Fatalf("the faults and the limiter were not exercised: %v", c)
	}
	if st := e.emu.Stats(); st.InFlight != 0 || st.Executing != 0 || e.emu.InFlight() != 0 || st.Applied != e.emu.AppliedCount() {
		t.Fatalf("slots or keys leaked: %+v", st)
	}
}
