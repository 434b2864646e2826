package stripeemulator_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/aurora-billing/aurora/stripeemulator"
)

// Every sentinel is matched by ==, errors.Is (also wrapped) and, for the
// typed errors, errors.As.
func TestSentinels(t *testing.T) {
	t.Parallel()
	_, faultErr := stripeemulator.ParseFaults("http500=9")
	_, answerErr := stripeemulator.ParseAnswer("418")
	emu, err := stripeemulator.New(stripeemulator.Config{})
	if err != nil {
		t.Fatal(err)
	}
	_, meterErr := emu.AddMeter(stripeemulator.MeterSpec{})
	customerErr := emu.AddCustomer("")
	_, configErr := stripeemulator.New(stripeemulator.Config{TimeoutHold: -1})
	cases := []struct {
		name     string
		err      error
		sentinel error
		as       func(error) bool
	}{
		{"faults", faultErr, stripeemulator.ErrInvalidFaults, func(err error) bool {
			var fe *stripeemulator.FaultSpecError
			return errors.As(err, &fe) && fe.Item == "http500=9"
		}},
		{"answer", answerErr, stripeemulator.ErrInvalidAnswer, func(err error) bool {
			var ae *stripeemulator.AnswerError
			return errors.As(err, &ae) && ae.Answer == "418"
		}},
		{"meter", meterErr, stripeemulator.ErrInvalidMeter, nil},
		{"customer", customerErr, stripeemulator.ErrInvalidCustomer, nil},
		{"config", configErr, stripeemulator.ErrInvalidConfig, nil},
	}
	for _, tc := range cases {
		if tc.err == nil {
			t.Fatalf("%s: no error", tc.name)
		}
		if tc.sentinel == tc.err && tc.as != nil {
			t.Fatalf("%s: a typed error must not be the bare sentinel", tc.name)
		}
		if !errors.Is(tc.err, tc.sentinel) {
			t.Fatalf("%s: errors.Is failed for %v", tc.name, tc.err)
		}
		wrapped := fmt.Errorf("context: %w", tc.err)
		if !errors.Is(wrapped, tc.sentinel) {
			t.Fatalf("%s: wrapped errors.Is failed", tc.name)
		}
		if tc.as != nil && (!tc.as(tc.err) || !tc.as(wrapped)) {
			t.Fatalf("%s: errors.As failed", tc.name)
		}
		if errors.Unwrap(tc.err) == nil && tc.err != tc.sentinel {
			t.Fatalf("%s: %v wraps nothing", tc.name, tc.err)
		}
	}
	if stripeemulator.ErrInvalidFaults == stripeemulator.ErrInvalidAnswer {
		t.Fatal("sentinels must be distinct")
	}
}
