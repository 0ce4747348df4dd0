package testenv

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
)

var dbURL string

func TestMain(m *testing.M) { os.Exit(RunWithDatabase(m, &dbURL)) }

func TestPackageDatabaseIsFreshAndRoundTrips(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatalf("connect to the package database: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })

	var tables int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Fatalf("a fresh database must have no tables, found %d", tables)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE round_trip (id int PRIMARY KEY, payload bytea)`); err != nil {
		t.Fatal(err)
	}
	// Leave the package database as fresh as it was found, for repeated runs (-count).
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), `DROP TABLE round_trip`) })
	want := []byte{0, 1, 2, 255}
	if _, err := conn.Exec(ctx, `INSERT INTO round_trip VALUES (1, $1)`, want); err != nil {
		t.Fatal(err)
	}
	var got []byte
	if err := conn.QueryRow(ctx, `SELECT payload FROM round_trip WHERE id = 1`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("payload = %v, want %v", got, want)
	}
}

func TestNewDatabaseIsIsolatedAndDropped(t *testing.T) {
	ctx := context.Background()
	other, drop, err := NewDatabase(ctx, "isolation")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	var name string
	if err := conn.QueryRow(ctx, `SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close(ctx)
	if pkgConn, err := pgx.Connect(ctx, dbURL); err != nil {
		t.Fatal(err)
	} else {
		var pkgName string
		_ = pkgConn.QueryRow(ctx, `SELECT current_database()`).Scan(&pkgName)
		_ = pkgConn.Close(ctx)
		if pkgName == name {
			t.Fatalf("two databases share the name %s", name)
		}
	}

	drop()
	server, err := ServerURL(ctx)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, server)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = admin.Close(ctx) }()
	var exists bool
	if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatalf("database %s still exists after drop", name)
	}
}
