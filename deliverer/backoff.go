package deliverer

import (
	"math/rand/v2"
	"time"
)

// Backoff returns the delay before retry number attempts (attempts ≥ 1 is
// the attempt that just failed): min(cap, base·2^(attempts−1)) (seed 000,
// "The knobs"; the same rule for every retryable answer), then "equal jitter": a uniform
// draw in [d/2, d]. Half the delay is kept so a retry never comes sooner than
// half the schedule; the other half spreads deliverers that failed together
// (AWS Architecture Blog, "Exponential Backoff And Jitter"). The result never
// exceeds cap. rnd returns a uniform float64 in [0, 1); nil uses math/rand/v2.
func Backoff(attempts int, base, cap time.Duration, rnd func() float64) time.Duration {
	if attempts < 1 {
		attempts = 1
	}
	d := base
	for i := 1; i < attempts && d < cap; i++ {
		d *= 2
	}
	if d > cap {
		d = cap
	}
	if rnd == nil {
		rnd = rand.Float64
	}
	half := d / 2
	return half + time.Duration(rnd()*float64(d-half))
}
