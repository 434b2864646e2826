package admin

import "github.com/aurora-billing/aurora/shared/config"

// sessionURL is AURORA_DATABASE_URL with the session bounds
// (AURORA_DATABASE_*_TIMEOUT_MS) every pooled connection opens with; the
// migrate commands use databaseURL, without them.
func sessionURL() (string, error) {
	var db config.Database
	if err := config.Load(&db); err != nil {
		return "", &ExitError{Code: ExitInvalidInput, Msg: err.Error(), Err: err}
	}
	return db.SessionURL(), nil
}
