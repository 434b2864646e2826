package migrations

import "context"

// UpTo applies the migrations up to and including version, as a database
// migrated by an older build would have them (tests only).
func UpTo(ctx context.Context, databaseURL string, version int64) error {
	p, db, err := provider(databaseURL)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = p.UpTo(ctx, version)
	return err
}
