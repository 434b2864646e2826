package main

import (
	"context"
	"testing"
)

func TestGaugesValidateExitCodes(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want int
	}{
		{"defaults", nil, 0},
		{"cap below range", map[string]string{"AURORA_GAUGES_COUNT_CAP": "5"}, 2},
		{"timeout not a number", map[string]string{"AURORA_GAUGES_QUERY_TIMEOUT_MS": "soon"}, 2},
		{"interval above range", map[string]string{"AURORA_GAUGES_MIN_INTERVAL_MS": "60001"}, 2},
		{"bad http addr", map[string]string{"AURORA_GAUGES_HTTP_ADDR": "nowhere"}, 2},
		{"bad database url", map[string]string{"AURORA_DATABASE_URL": "mysql://x"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			if got := run(context.Background(), []string{"gauges", "--validate"}); got != tc.want {
				t.Fatalf("exit %d, want %d", got, tc.want)
			}
		})
	}
}
