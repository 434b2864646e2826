package stripeemulator

import (
	"math/big"
	"strings"
)

// MaxValueDigits is the most significant digits a meter event value may
// have (Stripe refuses more, meter_event_value_too_many_digits). Values with
// at most 15 significant digits are also exact in a float64 when integral.
const MaxValueDigits = 15

// significantDigits counts the significant digits of a decimal string
// matched by the decimal pattern. Leading zeros do not count, nor trailing
// zeros after a decimal point; trailing zeros of an integer do (so every
// integer of at most 15 digits passes, and 10^15 does not): "1000" → 4,
// "100.50" → 4, "0.05" → 1.
func significantDigits(raw string) int {
	intPart, frac, _ := strings.Cut(strings.TrimPrefix(raw, "-"), ".")
	intPart, frac = strings.TrimLeft(intPart, "0"), strings.TrimRight(frac, "0")
	if intPart == "" {
		return len(strings.TrimLeft(frac, "0"))
	}
	return len(intPart) + len(frac)
}

// exactValue parses a decimal string matched by the decimal pattern
// exactly: sums of these never round, so the emulator's totals are an exact
// oracle.
func exactValue(raw string) (*big.Rat, bool) {
	return new(big.Rat).SetString(raw)
}

// ExactValue returns the event's value exactly, as parsed from the payload
// (Value is the same number as a float64, exact for integers).
func (ev AppliedEvent) ExactValue() *big.Rat {
	if ev.exact == nil {
		return new(big.Rat).SetFloat64(ev.Value)
	}
	return new(big.Rat).Set(ev.exact)
}

// ratFloat is r rounded to the nearest float64.
func ratFloat(r *big.Rat) float64 {
	f, _ := r.Float64()
	return f
}
