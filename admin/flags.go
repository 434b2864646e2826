package admin

import (
	"unicode/utf8"

	"github.com/aurora-billing/aurora/shared/field"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// maxFreeTextBytes bounds a free-text flag (--reason, --evidence): it is
// stored in an audit row, never indexed.
const maxFreeTextBytes = 16 << 10

// flagRules maps an identifier flag to the rule its value obeys (package
// field). Flags not listed are free text: valid UTF-8 without NUL, at most
// maxFreeTextBytes.
var flagRules = map[string]func(string) string{
	"tenant":              func(v string) string { return field.Text(v, field.MaxTenantBytes) },
	"feature":             field.Feature,
	"account":             func(v string) string { return field.Text(v, field.MaxStripeIDBytes) },
	"destination-account": func(v string) string { return field.Text(v, field.MaxStripeIDBytes) },
	"event-name":          func(v string) string { return field.Text(v, field.MaxFeatureBytes) },
	"actor":               func(v string) string { return field.Text(v, field.MaxTenantBytes) },
	"provider-ref":        func(v string) string { return field.Text(v, field.MaxStripeIDBytes) },
	"expect-provider-ref": func(v string) string { return field.Text(v, field.MaxStripeIDBytes) },
	"subject-ref":         func(v string) string { return field.Text(v, 1024) },
	"expect-subject-ref":  func(v string) string { return field.Text(v, 1024) },
}

// checkFlags checks every string flag the user set on cmd, once, before
// the command runs: identifier flags with their field rule, the others as
// free text. The first bad flag is an ExitInvalidInput error naming it
// (never quoting the value).
func checkFlags(cmd *cobra.Command) error {
	var bad error
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if bad != nil || f.Value.Type() != "string" {
			return
		}
		v := f.Value.String()
		reason := ""
		if rule, ok := flagRules[f.Name]; ok {
			reason = rule(v)
		} else {
			reason = freeText(v)
		}
		if reason != "" {
			bad = invalidInput("--%s %s", f.Name, reason)
		}
	})
	return bad
}

// checkArgs checks the positional arguments (an event id, an item id) as
// free text, before the command runs: an argument Postgres cannot hold is
// an ExitInvalidInput error naming its position, not a database error
// (found by FuzzFlags).
func checkArgs(args []string) error {
	for i, a := range args {
		if reason := freeText(a); reason != "" {
			return invalidInput("argument %d %s", i+1, reason)
		}
	}
	return nil
}

// freeText: valid UTF-8 (refused, never replaced), no NUL, at most
// maxFreeTextBytes.
func freeText(v string) string {
	switch {
	case !utf8.ValidString(v):
		return "must be valid UTF-8"
	case len(v) > maxFreeTextBytes:
		return "is longer than 16 KiB"
	}
	for i := 0; i < len(v); i++ {
		if v[i] == 0 {
			return "must not contain NUL"
		}
	}
	return ""
}
