//go:build race

package admin

// raceEnabled: the test binary runs under the race detector.
const raceEnabled = true
