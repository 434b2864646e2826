package stripeemulator

// SetExecHook installs h, called with the identifier as a meter event starts
// executing (its (customer, meter) slot held and its Idempotency-Key
// running), so tests can hold a call in flight without timing. Set it
// before serving requests.
func SetExecHook(e *Emulator, h func(identifier string)) {
	e.mu.Lock()
	e.execHook = h
	e.mu.Unlock()
}
