package events

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Querier is what Publish writes through: a pgx.Tx (or a pinned connection
// inside a transaction the caller controls).
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

const sqlInsertEvent = `
INSERT INTO event_outbox (event_id, event_type, aggregate_id, payload)
VALUES ($1, $2, $3, $4::jsonb)
ON CONFLICT (event_id) DO NOTHING`

// Publish writes ev to event_outbox in the caller's transaction tx and
// returns its id; the event commits or rolls back with tx (seed 004: the
// producer inserts its outbox record as pending). The dispatcher is woken
// by NOTIFY at commit. Invalid input returns *FieldError (ErrInvalidEvent);
// an ID already stored returns ErrDuplicateEvent (tx stays usable); other
// errors are the database's, wrapped.
func Publish(ctx context.Context, tx Querier, ev Event) (string, error) {
	if err := ev.Validate(); err != nil {
		return "", err
	}
	if ev.ID == "" {
		ev.ID = NewID()
	}
	var id string
	err := tx.QueryRow(ctx, sqlInsertEvent+` RETURNING event_id::text`, ev.ID, ev.Type, ev.AggregateID, string(ev.Payload)).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("%w: %s", ErrDuplicateEvent, ev.ID)
	}
	if err != nil {
		return "", fmt.Errorf("events: publish: %w", err)
	}
	return id, nil
}

// Queue adds ev's insert to b, for a caller that sends its transaction's
// writes as one pipelined batch (the webhook inbox's projections), and
// returns the event's id. An ID already stored is skipped (ON CONFLICT DO
// NOTHING): give Queue ids derived with IDFor, so replaying the same source
// fact announces it once. Invalid input returns *FieldError.
func Queue(b *pgx.Batch, ev Event) (string, error) {
	if err := ev.Validate(); err != nil {
		return "", err
	}
	if ev.ID == "" {
		ev.ID = NewID()
	}
	b.Queue(sqlInsertEvent, ev.ID, ev.Type, ev.AggregateID, string(ev.Payload))
	return ev.ID, nil
}

// IDFor derives a stable event id (a UUID of version 8, RFC 9562) from
// parts: SHA-256 over each part length-prefixed, so no two tuples encode
// alike. The same parts always give the same id, so a producer that handles
// one source fact twice announces it once.
func IDFor(parts ...string) string {
	h := sha256.New()
	var n [8]byte
	for _, p := range parts {
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write([]byte(p))
	}
	b := h.Sum(nil)[:16]
	b[6] = b[6]&0x0f | 0x80
	b[8] = b[8]&0x3f | 0x80
	s := hex.EncodeToString(b)
	return s[0:8] + "-" + s[8:12] + "-" + s[12:16] + "-" + s[16:20] + "-" + s[20:32]
}
