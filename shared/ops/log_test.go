package ops

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"
	"time"
)

// Durations are logged as text ("5s"), in groups too; other values keep
// their JSON types; the level drops what is below it.
func TestNewLoggerWritesDurationsAsText(t *testing.T) {
	var buf bytes.Buffer
	log := NewLogger(&buf, slog.LevelInfo)
	log.Debug("dropped")
	log.With("interval", 15*time.Minute).Warn("retrying", "retry_in", 5*time.Second, "attempt", 3,
		slog.Group("lease", "left", 250*time.Millisecond))
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, buf.String())
	}
	lease, _ := got["lease"].(map[string]any)
	for k, want := range map[string]any{"retry_in": "5s", "interval": "15m0s", "attempt": float64(3), "msg": "retrying"} {
		if got[k] != want {
			t.Errorf("%s = %#v, want %#v (%s)", k, got[k], want, buf.String())
		}
	}
	if lease["left"] != "250ms" {
		t.Errorf("lease.left = %#v, want \"250ms\"", lease["left"])
	}
	if bytes.Contains(buf.Bytes(), []byte("dropped")) {
		t.Error("a debug record was written at level info")
	}
}
