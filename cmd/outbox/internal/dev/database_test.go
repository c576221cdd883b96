package dev

import (
	"strings"
	"testing"
)

func TestChooseDatabase(t *testing.T) {
	const (
		pgURL    = "postgres://app:secret@db:5432/app"
		mysqlURL = "mysql://app:secret@db:3306/app"
	)
	for _, tc := range []struct {
		name string
		o    Options
		url  string
		want string
		err  string
	}{
		{name: "Default", want: "postgres"},
		{name: "Postgres", o: Options{Database: "postgres"}, want: "postgres"},
		{name: "MySQL", o: Options{Database: "mysql"}, want: "mysql"},
		{name: "FollowsMySQLURL", url: mysqlURL, want: "mysql"},
		{name: "FollowsPostgresURL", url: pgURL, want: "postgres"},
		{name: "MySQLWithMySQLURL", o: Options{Database: "mysql"}, url: mysqlURL, want: "mysql"},
		{name: "PostgresWithMySQLURL", o: Options{Database: "postgres"}, url: mysqlURL,
			err: "--database postgres, but DATABASE_URL (or database_url of the config) names a mysql database (app@db:3306/app)"},
		{name: "MySQLWithPostgresURL", o: Options{Database: "mysql"}, url: pgURL,
			err: "--database mysql, but DATABASE_URL (or database_url of the config) names a postgres database (app@db:5432/app): drop --database, or unset DATABASE_URL to run a private MariaDB server"},
		{name: "MySQLPortOnPostgres", o: Options{MySQLPort: 3307}, err: "--mysql-port 3307 is the port of the private MariaDB server of --database mysql"},
		{name: "PGPortOnMySQL", o: Options{Database: "mysql", PGPort: 5433}, err: "--pg-port 5433 is the port of the private PostgreSQL cluster"},
		{name: "BadURL", url: "redis://db", err: "DATABASE_URL: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := chooseDatabase(tc.o, tc.url)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("chooseDatabase = %q, %v; want an error containing %q", got, err, tc.err)
				}
				if strings.Contains(err.Error(), "secret") {
					t.Fatalf("the error shows the password: %v", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("chooseDatabase = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestRedactURL(t *testing.T) {
	for url, want := range map[string]string{
		"postgres://app:secret@db:5432/app?sslmode=disable": "app@db:5432/app",
		"mysql://root@127.0.0.1:33061/outbox":               "root@127.0.0.1:33061/outbox",
		"app:secret@tcp(db:3306)/orders":                    "app@db:3306/orders",
		"mysql://app:secret@db/app":                         "app@db:3306/app",
	} {
		if got := RedactURL(url); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", url, got, want)
		}
	}
}
