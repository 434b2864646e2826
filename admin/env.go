package admin

import (
	"sort"

	"github.com/aurora-billing/aurora/shared/config"
)

// EnvVars returns the AURORA_* variables auroractl reads, sorted:
// the database variables (config.Database) and AURORA_ACTOR everywhere, AURORA_STRIPE_API_KEY and
// AURORA_STRIPE_API_BASE for the commands that call Stripe (provision), and
// the services' export variables for the usage commands.
func EnvVars() []string {
	seen := map[string]bool{}
	for _, n := range append(config.Names(&usageEnv{}), config.Names(&config.Database{})...) {
		seen[n] = true
	}
	for _, n := range []string{"AURORA_DATABASE_URL", "AURORA_ACTOR", "AURORA_STRIPE_API_KEY", "AURORA_STRIPE_API_BASE"} {
		seen[n] = true
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
