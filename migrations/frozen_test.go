package migrations_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/aurora-billing/aurora/migrations"
)

// landedList is the checksum list of every migration on main, one
// "<sha256>  <file>" line each (the output of `sha256sum *.sql` in sql/).
// A migration is frozen once it is on this list: its file may never change
// or disappear, and a new migration must be numbered above every landed one
// (goose refuses a lower number on a database already past it). Landing a
// new migration means appending its line here.
const landedList = "landed.sha256"

func TestLandedMigrationsAreFrozen(t *testing.T) {
	t.Parallel()
	f, err := os.Open(landedList)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	landed := map[string]string{}
	var highest int64
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("%s:%d: want \"<sha256>  <file>\", got %q", landedList, n, sc.Text())
		}
		landed[name] = sum
		if v := version(t, name); v > highest {
			highest = v
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}

	files, err := fs.Glob(migrations.FS(), "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	onDisk := map[string]bool{}
	for _, name := range files {
		onDisk[name] = true
		body, err := fs.ReadFile(migrations.FS(), name)
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.Sum256(body)
		got := hex.EncodeToString(h[:])
		want, isLanded := landed[name]
		switch {
		case isLanded && got != want:
			t.Errorf("%s changed after it landed (sha256 %s, landed %s): migrations are frozen; restore it and add a new migration instead", name, got, want)
		case !isLanded && version(t, name) <= highest:
			t.Errorf("%s is numbered at or below the highest landed migration (%05d): number it above, or goose refuses it on every database already migrated", name, highest)
		case !isLanded:
			t.Errorf("%s is not in %s: append its line (`sha256sum %s` run in sql/) when it lands", name, landedList, name)
		}
	}
	for name := range landed {
		if !onDisk[name] {
			t.Errorf("%s landed but is gone: migrations are never removed", name)
		}
	}
}

func version(t *testing.T, name string) int64 {
	t.Helper()
	num, _, ok := strings.Cut(name, "_")
	v, err := strconv.ParseInt(num, 10, 64)
	if !ok || err != nil {
		t.Fatalf("migration %q is not named NNNNN_name.sql", name)
	}
	return v
}
