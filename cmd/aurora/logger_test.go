package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every service logs through ops.NewLogger, whose JSON writes durations as
// text ("5s"): a JSON handler built elsewhere would log them as integer
// nanoseconds ("retry_in": 5000000000).
func TestServicesLogThroughTheSharedLogger(t *testing.T) {
	const root = "../.."
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		if rel == filepath.Join("shared", "ops", "log.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), "slog.NewJSONHandler(") {
			t.Errorf("%s builds its own slog JSON handler: use ops.NewLogger (durations as text)", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
