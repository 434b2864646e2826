package ops

import (
	"io"
	"log/slog"
)

// NewLogger returns the logger every aurora service writes with: one JSON
// object per line on w, records below level dropped, and every
// time.Duration attribute written as Go's text form ("5s", "1m30s",
// "250ms") instead of slog's integer nanoseconds (DurationsAsText). Logs
// never carry payloads, customer ids, signatures or keys: that is the
// callers' rule, not the handler's.
func NewLogger(w io.Writer, level slog.Leveler) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: DurationsAsText}))
}

// DurationsAsText is a slog.HandlerOptions.ReplaceAttr that writes a
// time.Duration value as its String() ("5s") and leaves every other
// attribute as it is. It applies inside groups too.
func DurationsAsText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}
