package deliverer

import "context"

// WithBeforeReattach makes the deliverer run f before it re-attaches a
// stopped consume loop of partition p (f may block until ctx ends), so a
// test can look at the deliverer while a loop is down.
func WithBeforeReattach(f func(ctx context.Context, p int)) Option {
	return func(d *Deliverer) error { d.beforeReattach = f; return nil }
}
