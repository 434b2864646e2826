package main

import (
	"context"
	"os"
	"testing"
)

// TestDemoValidateExitCodes: `aurora demo --validate` checks the flags and
// the environment and exits 0, or 2 naming what is wrong, before anything
// is started.
func TestDemoValidateExitCodes(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want int
	}{
		{"defaults", nil, nil, 0},
		{"usage period hour", map[string]string{"AURORA_USAGE_PERIOD": "hour"}, nil, 0},
		{"usage period out of range", map[string]string{"AURORA_USAGE_PERIOD": "week"}, nil, 2},
		{"mode matching the emulator's test key", map[string]string{"AURORA_STRIPE_MODE": "test"}, nil, 0},
		{"live mode against the emulator's test key", map[string]string{"AURORA_STRIPE_MODE": "live"}, nil, 2},
		{"live mode against a test key", map[string]string{"AURORA_STRIPE_MODE": "live", "AURORA_STRIPE_API_KEY": "sk_test_x",
			"AURORA_STRIPE_API_BASE": "http://127.0.0.1:12111"}, nil, 2},
		{"live mode with a live key", map[string]string{"AURORA_STRIPE_MODE": "live", "AURORA_STRIPE_API_KEY": "sk_live_x",
			"AURORA_STRIPE_API_BASE": "http://127.0.0.1:12111"}, nil, 0},
		{"key without base", map[string]string{"AURORA_STRIPE_API_KEY": "sk_test_x"}, nil, 2},
		{"no deliverers", nil, []string{"--deliverers", "0"}, 2},
		{"bad faults", nil, []string{"--faults", "http500=2"}, 2},
		{"only a backoff base above the demo's cap", map[string]string{"AURORA_OUTBOX_BACKOFF_BASE_SECONDS": "20"}, nil, 0},
		{"four partitions", map[string]string{"AURORA_OUTBOX_PARTITIONS": "4"}, nil, 0},
		{"no partitions", map[string]string{"AURORA_OUTBOX_PARTITIONS": "0"}, nil, 2},
		{"too many stream replicas", map[string]string{"AURORA_OUTBOX_STREAM_REPLICAS": "6"}, nil, 2},
		{"replicas on the embedded JetStream", map[string]string{"AURORA_OUTBOX_STREAM_REPLICAS": "3"}, nil, 2},
		{"replicas on an external JetStream", map[string]string{"AURORA_OUTBOX_STREAM_REPLICAS": "3", "AURORA_NATS_URL": "nats://127.0.0.1:4222"}, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{"AURORA_USAGE_PERIOD", "AURORA_STRIPE_MODE", "AURORA_STRIPE_API_KEY", "AURORA_STRIPE_API_BASE",
				"AURORA_OUTBOX_BACKOFF_BASE_SECONDS", "AURORA_OUTBOX_BACKOFF_CAP_SECONDS", "AURORA_OUTBOX_PARTITIONS", "AURORA_OUTBOX_STREAM_REPLICAS", "AURORA_NATS_URL"} {
				t.Setenv(k, "") // restored after the test
				os.Unsetenv(k)
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			args := append([]string{"demo", "--validate"}, tc.args...)
			if got := run(context.Background(), args); got != tc.want {
				t.Fatalf("exit %d, want %d", got, tc.want)
			}
		})
	}
}

// TestShortenBackoff: the demo's short backoff fills in only what is not
// set, consistently with what is.
func TestShortenBackoff(t *testing.T) {
	const b, c = "AURORA_OUTBOX_BACKOFF_BASE_SECONDS", "AURORA_OUTBOX_BACKOFF_CAP_SECONDS"
	for _, tc := range []struct {
		name              string
		in                map[string]string
		wantBase, wantCap string
	}{
		{"neither set", map[string]string{}, "1", "10"},
		{"base below the demo cap", map[string]string{b: "3"}, "3", "10"},
		{"base above the demo cap is its own cap", map[string]string{b: "20"}, "20", "20"},
		{"cap above the demo base", map[string]string{c: "60"}, "1", "60"},
		{"both set: untouched", map[string]string{b: "7", c: "9"}, "7", "9"},
		{"unparsable base: left for the check", map[string]string{b: "x"}, "x", "10"},
		{"empty counts as unset", map[string]string{b: "", c: ""}, "1", "10"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shortenBackoff(tc.in)
			if tc.in[b] != tc.wantBase || tc.in[c] != tc.wantCap {
				t.Fatalf("base %q cap %q, want %q %q", tc.in[b], tc.in[c], tc.wantBase, tc.wantCap)
			}
		})
	}
}
