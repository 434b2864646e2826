package deliverer

import (
	"github.com/aurora-billing/aurora/shared/field"
)

// truncateUTF8 returns s cut to at most n bytes without splitting a UTF-8
// character (Postgres refuses a text value with a broken sequence, and one
// such value fails a whole outcome batch). Invalid bytes already in s are
// replaced by U+FFFD first, for the same reason, and so is NUL, which
// Postgres text cannot hold at all.
func truncateUTF8(s string, n int) string { return field.Storable(s, n) }

// keyPrefix is the part of an idempotency key safe and sufficient for logs.
func keyPrefix(key string) string {
	if len(key) > 12 {
		return key[:12]
	}
	return key
}
