package config_test

import (
	"reflect"
	"testing"

	"github.com/aurora-billing/aurora/shared/config"
)

type nested struct {
	Workers int    `env:"RELAY_WORKERS" envDefault:"4"`
	Key     string `env:"STRIPE_API_KEY"`
}

type DB struct {
	URL string `env:"DATABASE_URL" envDefault:"postgres://postgres@127.0.0.1:5432/test?sslmode=disable"`
}

type sample struct {
	DB
	N     nested `envPrefix:""`
	Inner struct {
		Poll int `env:"POLL_MS" envDefault:"10"`
	} `envPrefix:"RELAY_"`
	hidden int
}

func (sample) Validate() error { return nil }

func TestVarsListsWhatLoadReads(t *testing.T) {
	t.Setenv("AURORA_DATABASE_URL", "postgres://u:secretpw@db:5432/x")
	t.Setenv("AURORA_STRIPE_API_KEY", "sk_test_123")
	var s sample
	if err := config.Load(&s); err != nil {
		t.Fatal(err)
	}
	got := config.Vars(&s)
	want := []config.Var{
		{Name: "AURORA_DATABASE_URL", Value: "postgres://u:xxxxx@db:5432/x", Default: "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", Set: true},
		{Name: "AURORA_RELAY_WORKERS", Value: "4", Default: "4"},
		{Name: "AURORA_STRIPE_API_KEY", Value: "(set)", Set: true},
		{Name: "AURORA_RELAY_POLL_MS", Value: "10", Default: "10"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
}

func TestUnknownVarsNameTheClosest(t *testing.T) {
	known := []string{"AURORA_RELAY_WORKERS", "AURORA_RELAY_POLL_MS", "AURORA_DATABASE_URL"}
	env := []string{"AURORA_RELAY_WORKRS=3", "PATH=/bin", "AURORA_DATABASE_URL=x", "AURORA_DATABSE_URL=y", "AURORA_=z"}
	got := config.UnknownVars(env, known)
	want := []config.Unknown{
		{Name: "AURORA_", Closest: "AURORA_DATABASE_URL"},
		{Name: "AURORA_DATABSE_URL", Closest: "AURORA_DATABASE_URL"},
		{Name: "AURORA_RELAY_WORKRS", Closest: "AURORA_RELAY_WORKERS"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	if got := config.UnknownVars(env, nil); len(got) != 4 || got[0].Closest != "" {
		t.Fatalf("no known names: %+v", got)
	}
}
