package deliverer

import (
	"errors"
	"fmt"
)

var (
	// ErrInvalidOption is wrapped by every Option that refuses its argument.
	ErrInvalidOption = errors.New("deliverer: invalid option")
	// ErrForeignDatabase: the stream, or a message, was staged by another
	// outbox database than the deliverer's (*ForeignDatabaseError names
	// both). The deliverer refuses to start; a stray message is left
	// untouched (never terminated).
	ErrForeignDatabase = errors.New("deliverer: outbox of another database")
	// ErrConsumerClash: a running deliverer already consumes the durable
	// with other filter subjects (*ConsumerClashError names both).
	ErrConsumerClash = errors.New("deliverer: consumer filter clash")
	// ErrNoPartitions: the stream carries no partition count (a relay older
	// than lane ownership created it).
	ErrNoPartitions = errors.New("deliverer: stream has no partition count")
)

// ForeignDatabaseError names the deliverer's outbox database and the one
// the stream or message came from. It wraps ErrForeignDatabase.
type ForeignDatabaseError struct {
	Where string // "stream AURORA_OUTBOX" or "message"
	Ours  string // this deliverer's outbox.DatabaseID
	Their string // the stream's or message's
}

func (e *ForeignDatabaseError) Error() string {
	return fmt.Sprintf("deliverer: %s belongs to outbox database %s, this deliverer's database is %s: "+
		"point AURORA_DATABASE_URL and AURORA_NATS_URL at the same deployment (each deployment needs its own NATS or JetStream domain)",
		e.Where, e.Their, e.Ours)
}

// Unwrap returns ErrForeignDatabase.
func (e *ForeignDatabaseError) Unwrap() error { return ErrForeignDatabase }

// ConsumerClashError names a durable consumer that a running deliverer
// consumes with other filter subjects than this one's. It wraps
// ErrConsumerClash.
type ConsumerClashError struct {
	Consumer string
	Theirs   []string
	Ours     []string
}

func (e *ConsumerClashError) Error() string {
	return fmt.Sprintf("deliverer: consumer %s is consumed with filter %v, this deliverer is configured with %v: "+
		"replicas of one pool (AURORA_DELIVERER_CONSUMER) need the same AURORA_DELIVERER_FILTER_SUBJECT; give another pool its own consumer name",
		e.Consumer, e.Theirs, e.Ours)
}

// Unwrap returns ErrConsumerClash.
func (e *ConsumerClashError) Unwrap() error { return ErrConsumerClash }
