package config_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/config"
)

func TestDatabaseKind(t *testing.T) {
	for url, want := range map[string]string{
		"":                                              config.DatabasePostgres,
		"postgres://app@db:5432/app":                    config.DatabasePostgres,
		"postgresql://db/app?sslmode=x":                 config.DatabasePostgres,
		"host=db dbname=app user=app":                   config.DatabasePostgres,
		"host=db password=p@ss/word dbname=app":         config.DatabasePostgres,
		" dbname = app":                                 config.DatabasePostgres,
		"mysql://app:secret@db:3306/app":                config.DatabaseMySQL,
		"MYSQL://db/app":                                config.DatabaseMySQL,
		"mariadb://app@db/app":                          config.DatabaseMySQL,
		"app:secret@tcp(db:3306)/app":                   config.DatabaseMySQL,
		"app@unix(/run/mysqld.sock)/app?parseTime=true": config.DatabaseMySQL,
		"app:p@ss/word@tcp(db:3306)/app":                config.DatabaseMySQL,
		"app@unix(/run/mysqld/mysqld.sock)/app":         config.DatabaseMySQL,
		"/app":                                          config.DatabaseMySQL,
	} {
		got, err := config.DatabaseKind(url)
		require.NoError(t, err, url)
		require.Equal(t, want, got, url)
	}
	for _, url := range []string{"redis://u:hunter2@db:6379", "sqlite:app.db", "app:hunter2@db", `"host=db password=hunter2"`, "host:db password=hunter2"} {
		_, err := config.DatabaseKind(url)
		require.Error(t, err, url)
		require.NotContains(t, err.Error(), "hunter2")
		require.Contains(t, err.Error(), "mysql://")
	}
}

func TestValidateOnMySQL(t *testing.T) {
	c := config.Config{DatabaseURL: "mysql://root@127.0.0.1:3306/app", Schema: "outbox"}
	c = c.WithDefaults()
	err := c.Validate()
	require.ErrorContains(t, err, `schema: "outbox" applies to PostgreSQL only`)
	c.Schema = ""
	c = c.WithDefaults()
	require.NotContains(t, errString(c.Validate()), "schema")

	c.Relay.Wakeup = "notify"
	require.ErrorContains(t, c.Validate(), "relay.wakeup: notify listens to PostgreSQL's NOTIFY")
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
