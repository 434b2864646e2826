package relay

import (
	"errors"
	"reflect"
	"testing"

	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/natstest"
)

func TestConfigDefaultsMatchEnvDefaults(t *testing.T) {
	t.Parallel()
	var got Config
	if err := config.LoadFrom(&got, map[string]string{}); err != nil {
		t.Fatal(err)
	}
	if want := DefaultConfig(); !reflect.DeepEqual(got, want) {
		t.Fatalf("env defaults %+v\nDefaultConfig %+v", got, want)
	}
}

func TestConfigRejectsOutOfRangeNamingTheVariable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env, value string
	}{
		{"AURORA_RELAY_POLL_MS", "9"},
		{"AURORA_RELAY_POLL_MS", "60001"},
		{"AURORA_RELAY_REDISPATCH_SECONDS", "4"},
		{"AURORA_RELAY_REDISPATCH_SECONDS", "86401"},
		{"AURORA_RELAY_REDISPATCH_SCAN_MS", "9"},
		{"AURORA_RELAY_MAX_INFLIGHT", "0"},
		{"AURORA_RELAY_MAX_INFLIGHT", "10001"},
		{"AURORA_RELAY_WORKERS", "0"},
		{"AURORA_RELAY_WORKERS", "65"},
		{"AURORA_RELAY_PUBLISH_TIMEOUT_MS", "99"},
		{"AURORA_OUTBOX_BATCH_SIZE", "0"},
		{"AURORA_OUTBOX_BATCH_SIZE", "1001"},
		{"AURORA_OUTBOX_STREAM_REPLICAS", "0"},
		{"AURORA_OUTBOX_STREAM_REPLICAS", "6"},
		{"AURORA_OUTBOX_DUPLICATE_WINDOW_SECONDS", "9"},
		{"AURORA_RELAY_WORKERS", "many"},
	} {
		t.Run(tc.env+"="+tc.value, func(t *testing.T) {
			t.Parallel()
			var c Config
			err := config.LoadFrom(&c, map[string]string{tc.env: tc.value})
			if !errors.Is(err, config.ErrInvalid) {
				t.Fatalf("err %v, want config.ErrInvalid", err)
			}
			var re *config.RangeError
			if !errors.As(err, &re) || re.Var != tc.env {
				t.Fatalf("err %v, want a *config.RangeError naming %s", err, tc.env)
			}
		})
	}
}

func TestNewRefusesBadInput(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	bad := DefaultConfig()
	bad.Workers = 0
	for _, tc := range []struct {
		name string
		call func() error
		want error
	}{
		{"nil pool", func() error { _, err := New(nil, nil, DefaultConfig()); return err }, ErrNilDependency},
		{"nil js", func() error { _, err := New(pool, nil, DefaultConfig()); return err }, ErrNilDependency},
	} {
		if err := tc.call(); !errors.Is(err, tc.want) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
		}
	}
	_, js := connect(t, natstest.New(t))
	for _, tc := range []struct {
		name string
		cfg  Config
		opt  Option
		want error
	}{
		{"invalid config", bad, nil, config.ErrInvalid},
		{"nil clock", DefaultConfig(), WithClock(nil), ErrInvalidOption},
		{"nil logger", DefaultConfig(), WithLogger(nil), ErrInvalidOption},
		{"nil registry", DefaultConfig(), WithRegistry(nil), ErrInvalidOption},
		{"backoff base zero", DefaultConfig(), WithBackoff(0, 1), ErrInvalidOption},
		{"backoff cap below base", DefaultConfig(), WithBackoff(2, 1), ErrInvalidOption},
	} {
		var opts []Option
		if tc.opt != nil {
			opts = append(opts, tc.opt)
		}
		if _, err := New(pool, js, tc.cfg, opts...); !errors.Is(err, tc.want) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
		}
	}
}
