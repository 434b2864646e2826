package stripeemulator

import (
	"crypto/sha256"
	"net/http"
	"time"
)

// Stripe's idempotency layer (docs "Idempotent requests"): the result of an
// executed request is saved with its key; the same key with the same
// parameters replays it; other parameters are an idempotency_error; a
// request that fails validation, or conflicts with one still running, saves
// nothing. Keys are scoped to the API key (one key per account here).

// executed is what a request's execution returns: the reply and whether it is saved
// under the Idempotency-Key.
type executed struct {
	reply reply
	save  bool
}

// idempotent runs exec under c's Idempotency-Key (if any) and returns the
// reply to write: exec's, a replay, a 400 idempotency_error or a 409
// idempotency_key_in_use.
func (e *Emulator) idempotent(c *call, exec func() executed) reply {
	if c.idemKey == "" {
		return exec().reply
	}
	scope := idemScope(c.apiKey, c.idemKey)
	fp := fingerprint(c)
	e.mu.Lock()
	e.pruneIdemLocked(e.cfg.Now())
	if en, ok := e.idem[scope]; ok {
		saved := *en // read under the lock; en changes when its request finishes
		e.mu.Unlock()
		switch {
		case saved.fingerprint != fp:
			return errReply(&apiError{Status: http.StatusBadRequest, Type: TypeIdempotencyError,
				Message: "Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '" + c.idemKey + "' if you meant to execute a different request."},
				OutcomeIdempotencyMismatch)
		case saved.running:
			return errReply(&apiError{Status: http.StatusConflict, Type: TypeInvalidRequestError, Code: CodeIdempotencyKeyInUse,
				Message: "There is currently another in-progress request using this idempotent key (that probably means you submitted twice, and the other request is still going through): " + c.idemKey + ". Please try again later."},
				OutcomeKeyInUse)
		default:
			return reply{status: saved.status, body: saved.body, outcome: OutcomeReplayed,
				header: map[string]string{"Idempotent-Replayed": "true", "Original-Request": saved.requestID}}
		}
	}
	en := &idemEntry{fingerprint: fp, running: true}
	e.idem[scope] = en
	e.executingN++
	e.mu.Unlock()

	res := exec()

	e.mu.Lock()
	defer e.mu.Unlock()
	e.executingN--
	if !res.save {
		if e.idem[scope] == en {
			delete(e.idem, scope)
		}
		return res.reply
	}
	en.running = false
	en.status, en.body, en.requestID, en.at = res.reply.status, res.reply.body, c.requestID, e.cfg.Now()
	e.idemQueue = append(e.idemQueue, idemQueued{key: scope, at: en.at})
	return res.reply
}

// idemScope is the map key of an Idempotency-Key under an API key: a
// fixed-size hash, so a saved result does not keep the key strings alive.
func idemScope(apiKey, idemKey string) [32]byte {
	h := sha256.New()
	h.Write([]byte(apiKey))
	h.Write([]byte{0})
	h.Write([]byte(idemKey))
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

// fingerprint identifies a request's parameters: method, path and the
// sorted form (so a byte-different encoding of the same parameters still
// matches, as at Stripe).
func fingerprint(c *call) [32]byte {
	h := sha256.New()
	h.Write([]byte(c.r.Method))
	h.Write([]byte{0})
	h.Write([]byte(c.r.URL.Path))
	h.Write([]byte{0})
	h.Write([]byte(c.form.Encode()))
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

// pruneIdemLocked forgets saved results older than IdempotencyTTL.
func (e *Emulator) pruneIdemLocked(now time.Time) {
	cut := now.Add(-e.cfg.IdempotencyTTL)
	i := 0
	for ; i < len(e.idemQueue) && !e.idemQueue[i].at.After(cut); i++ {
		q := e.idemQueue[i]
		if en, ok := e.idem[q.key]; ok && !en.running && en.at.Equal(q.at) {
			delete(e.idem, q.key)
		}
	}
	if i > 0 {
		e.idemQueue = e.idemQueue[i:]
	}
}
