package gauge

import (
	"errors"
	"time"

	"github.com/aurora-billing/aurora/shared/config"
)

// Defaults and ranges of Config.
const (
	QueryTimeoutMSDefault = 5000
	QueryTimeoutMSMin     = 100
	QueryTimeoutMSMax     = 60000

	CountCapDefault = 100000
	CountCapMin     = 100
	CountCapMax     = 10000000

	MinIntervalMSDefault = 5000
	MinIntervalMSMin     = 0
	MinIntervalMSMax     = 60000
)

// Config bounds what a measurement may cost.
type Config struct {
	// QueryTimeoutMS is the statement_timeout of every query and the
	// deadline of one whole measurement, in milliseconds.
	// AURORA_GAUGES_QUERY_TIMEOUT_MS, 100..60000; defaults to 5000.
	QueryTimeoutMS int `env:"GAUGES_QUERY_TIMEOUT_MS" envDefault:"5000"`
	// CountCap is the most rows any one count reads; a count equal to it
	// means "at least CountCap". AURORA_GAUGES_COUNT_CAP, 100..10000000;
	// defaults to 100000.
	CountCap int `env:"GAUGES_COUNT_CAP" envDefault:"100000"`
	// MinIntervalMS is how long a successful measurement is reused before
	// the next scrape queries again, in milliseconds; 0 measures on every
	// scrape. AURORA_GAUGES_MIN_INTERVAL_MS, 0..60000; defaults to 5000.
	MinIntervalMS int `env:"GAUGES_MIN_INTERVAL_MS" envDefault:"5000"`
}

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{QueryTimeoutMS: QueryTimeoutMSDefault, CountCap: CountCapDefault, MinIntervalMS: MinIntervalMSDefault}
}

// Validate names every variable out of its range (*config.RangeError,
// errors.Is config.ErrInvalid).
func (c Config) Validate() error {
	return errors.Join(
		config.IntRange("GAUGES_QUERY_TIMEOUT_MS", c.QueryTimeoutMS, QueryTimeoutMSMin, QueryTimeoutMSMax, "ms"),
		config.IntRange("GAUGES_COUNT_CAP", c.CountCap, CountCapMin, CountCapMax, "rows"),
		config.IntRange("GAUGES_MIN_INTERVAL_MS", c.MinIntervalMS, MinIntervalMSMin, MinIntervalMSMax, "ms"),
	)
}

func (c Config) queryTimeout() time.Duration {
	return time.Duration(c.QueryTimeoutMS) * time.Millisecond
}

func (c Config) minInterval() time.Duration {
	return time.Duration(c.MinIntervalMS) * time.Millisecond
}
