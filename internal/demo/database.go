package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seqinbox/seqinbox/migrations"
)

// tempDatabase is the demo's own database on the server the user pointed it at.
type tempDatabase struct {
	// Name is the database name, URL its connection URL.
	Name, URL string
	server    string
}

// createDatabase creates a uniquely named database on the server of serverURL (any database of
// it) and returns its URL. The caller drops it.
func createDatabase(ctx context.Context, serverURL string) (*tempDatabase, error) {
	u, err := url.Parse(serverURL)
	if err != nil {
		return nil, fmt.Errorf("parse the database URL: %w", err)
	}
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	name := "seqinbox_demo_" + hex.EncodeToString(suffix)
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", u.Redacted(), err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create database %s on %s: %w", name, u.Host, err)
	}
	u.Path = "/" + name
	return &tempDatabase{Name: name, URL: u.String(), server: serverURL}, nil
}

// drop removes the database, disconnecting whoever is still connected. It runs on cleanup, also
// after Ctrl-C, so it does not take the (cancelled) run context.
func (db *tempDatabase) drop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, db.server)
	if err != nil {
		return fmt.Errorf("drop database %s: %w", db.Name, err)
	}
	defer func() { _ = conn.Close(ctx) }()
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db.Name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", db.Name, err)
	}
	return nil
}

// migrate applies the embedded schema, as `seqinbox migrate` does; the consumers refuse an older
// schema. It returns the schema version.
func (db *tempDatabase) migrate(ctx context.Context) (int, error) {
	pool, err := pgxpool.New(ctx, db.URL)
	if err != nil {
		return 0, fmt.Errorf("migrate %s: %w", db.Name, err)
	}
	defer pool.Close()
	res, err := migrations.Apply(ctx, pool)
	if err != nil {
		return 0, fmt.Errorf("migrate %s: %w", db.Name, err)
	}
	return res.After, nil
}
