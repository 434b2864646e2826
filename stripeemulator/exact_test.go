package stripeemulator_test

import (
	"fmt"
	"math/big"
	"testing"

	"github.com/aurora-billing/aurora/stripeemulator"
)

// The totals are exact above 2^53, where float64 sums round: the oracle
// that compares committed with applied quantities must never report a
// false mismatch. Cancelling subtracts exactly too.
func TestAppliedTotalsExactAbove2To53(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stripeemulator.Config{})
	const v = 999_999_999_999_999
	const n = 12 // 12 × v > 2^53
	for i := range n {
		if _, err := e.sc.BillingMeterEvents.New(event(fmt.Sprintf("big-%d", i), custA, fmt.Sprint(v), epoch)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.sc.BillingMeterEvents.New(event("small", custA, "1", epoch)); err != nil {
		t.Fatal(err)
	}
	want := new(big.Rat).SetInt64(n*v + 1)
	if got := e.emu.AppliedTotalsExact()[eventName]; got.Cmp(want) != 0 {
		t.Fatalf("exact total %s, want %s", got.RatString(), want.RatString())
	}
	sum := new(big.Rat)
	for _, ev := range e.emu.Applied() {
		sum.Add(sum, ev.ExactValue())
	}
	if sum.Cmp(want) != 0 {
		t.Fatalf("sum of ExactValue %s, want %s", sum.RatString(), want.RatString())
	}
	// Decimal values are exact as well: 0.1 + 0.2 is 0.3.
	for i, d := range []string{"0.1", "0.2"} {
		if _, err := e.sc.BillingMeterEvents.New(event(fmt.Sprintf("dec-%d", i), custB, d, epoch)); err != nil {
			t.Fatal(err)
		}
	}
	want.Add(want, big.NewRat(3, 10))
	if got := e.emu.AppliedTotalsExact()[eventName]; got.Cmp(want) != 0 {
		t.Fatalf("with decimals %s, want %s", got.RatString(), want.RatString())
	}
}
