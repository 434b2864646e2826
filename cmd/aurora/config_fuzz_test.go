package main

import (
	"errors"
	"net/url"
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/field"
)

// FuzzConfigLoad: any environment, loaded into every service's
// configuration (go test -fuzz '^FuzzConfigLoad$' ./cmd/aurora). The input
// is NAME=VALUE lines (AURORA_ is added to a NAME without it). Seeds: every
// variable a service reads with ids from testdata/seed/ids.txt (taken from
// the shared data folder, see testdata/seed/SOURCES.md); regressions in
// testdata/fuzz/FuzzConfigLoad/.
//
// Invariants: loading never panics; a refusal wraps config.ErrInvalid; no
// refusal quotes a secret (the Stripe key, a webhook secret, the password
// of a *_URL); and an accepted Stripe account is an id Postgres can store
// (field.Text), since every staged item carries it.
func FuzzConfigLoad(f *testing.F) {
	data, err := os.ReadFile("testdata/seed/ids.txt")
	if err != nil {
		f.Fatal(err)
	}
	ids := strings.Fields(string(data))
	names := knownVars()
	sort.Strings(names)
	var all []string
	for _, n := range names {
		v := "1"
		switch {
		case strings.HasSuffix(n, "_URL"):
			v = "postgres://aurora:s3cretpassw0rd@127.0.0.1:5432/test"
		case strings.HasSuffix(n, "_ADDR"):
			v = "127.0.0.1:0"
		case strings.Contains(n, "ACCOUNT"):
			v = ids[3]
		case strings.Contains(n, "KEY"):
			v = "sk_test_" + ids[0]
		}
		all = append(all, n+"="+v)
		f.Add(n + "=" + v)
	}
	f.Add(strings.Join(all, "\n"))
	f.Add("DATABASE_URL=postgres://aurora:s3cretpassw0rd@127.0.0.1:5432/test\x7f\nSTRIPE_ACCOUNT=" + ids[3] + "\xff")
	f.Add("STRIPE_API_KEY=sk_live_" + ids[1] + "\nINBOX_WEBHOOK_SECRETS=whsec_abcdefgh,whsec_ijklmnop\nSTRIPE_ACCOUNT= ")
	f.Fuzz(func(t *testing.T, input string) {
		env := map[string]string{}
		for _, line := range strings.Split(input, "\n") {
			name, value, ok := strings.Cut(line, "=")
			if !ok {
				continue
			}
			if !strings.HasPrefix(name, config.Prefix) {
				name = config.Prefix + name
			}
			env[name] = value
		}
		secretOf := map[string]string{} // secret -> the variable holding it
		for name, value := range env {
			if strings.Contains(name, "KEY") || strings.Contains(name, "SECRET") || strings.Contains(name, "PASSWORD") {
				for _, s := range strings.Split(value, ",") {
					secretOf[s] = name
				}
			}
			if !strings.HasSuffix(name, "_URL") {
				continue // a URL-shaped value of another variable holds no password of ours
			}
			if u, err := url.Parse(value); err == nil {
				if p, ok := u.User.Password(); ok {
					secretOf[p] = name
				}
			} else if _, rest, ok := strings.Cut(value, "://"); ok { // unparseable, but shaped like one
				if userinfo, _, ok := strings.Cut(rest, "@"); ok {
					if _, p, ok := strings.Cut(userinfo, ":"); ok {
						secretOf[p] = name
					}
				}
			}
		}
		// A secret that is also part of another variable's value may be
		// quoted as that value (a malformed integer is shown as given).
		var secrets []string
		for s, holder := range secretOf {
			shared := false
			for name, value := range env {
				if name != holder && strings.Contains(value, s) {
					shared = true
				}
			}
			if !shared {
				secrets = append(secrets, s)
			}
		}
		for svc, proto := range serviceConfigs() {
			cfg := reflect.New(reflect.TypeOf(proto).Elem()).Interface().(config.Validator)
			err := config.LoadFrom(cfg, env)
			if err != nil {
				if !errors.Is(err, config.ErrInvalid) {
					t.Fatalf("%s: refusal %v does not wrap config.ErrInvalid", svc, err)
				}
				// what a refusal may show of a value: the value part of
				// "VAR=value", without the fixed texts (allowed ranges,
				// "(redacted)") a short secret could happen to match
				msg := err.Error()
				for _, re := range rangeErrors(err) {
					msg = strings.ReplaceAll(msg, re.Allowed, "")
				}
				for _, fixed := range []string{"(redacted)", "(unparseable URL, redacted)", "xxxxx"} {
					msg = strings.ReplaceAll(msg, fixed, "")
				}
				for _, s := range secrets {
					if len(s) >= 8 && strings.Contains(msg, s) {
						t.Fatalf("%s: refusal quotes a secret: %v", svc, err)
					}
				}
				continue
			}
			for _, acct := range exportAccounts(reflect.ValueOf(cfg)) {
				if r := field.Text(acct, field.MaxStripeIDBytes); r != "" {
					t.Fatalf("%s: AURORA_STRIPE_ACCOUNT accepted although it %s", svc, r)
				}
			}
		}
	})
}

// exportAccounts returns the StripeAccount of every config.Export inside v.
func exportAccounts(v reflect.Value) []string {
	for v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return nil
	}
	if e, ok := v.Interface().(config.Export); ok {
		return []string{e.StripeAccount}
	}
	var out []string
	for i := 0; i < v.NumField(); i++ {
		if v.Type().Field(i).IsExported() {
			out = append(out, exportAccounts(v.Field(i))...)
		}
	}
	return out
}

// rangeErrors returns every *config.RangeError inside err (joined or
// wrapped).
func rangeErrors(err error) []*config.RangeError {
	var re *config.RangeError
	if errors.As(err, &re) && err == error(re) {
		return []*config.RangeError{re}
	}
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		var out []*config.RangeError
		for _, e := range u.Unwrap() {
			out = append(out, rangeErrors(e)...)
		}
		return out
	case interface{ Unwrap() error }:
		return rangeErrors(u.Unwrap())
	}
	return nil
}
