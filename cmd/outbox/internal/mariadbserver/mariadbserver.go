// Package mariadbserver runs a private MariaDB (or MySQL) server for outbox dev: its data
// folder made once with the locally installed server programs, the server started as a
// child process and stopped with it.
//
// The data is kept in Dir/mariadb. A new data folder is made in a sibling folder
// (Dir/mariadb.init) and renamed into place once the initialisation has finished, so a
// half-made one is never started; one left by an interrupted initialisation is made
// again. The server listens on 127.0.0.1 only, and root logs in without a password, as
// the private PostgreSQL cluster of outbox dev lets its postgres user in.
package mariadbserver

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/outbox-go/outbox/internal/localserver"
)

// Database is the database Start creates and [Server.URL] names.
const Database = "outbox"

// Product names.
const (
	MariaDB = "MariaDB"
	MySQL   = "MySQL"
)

// Options say where and how to run the server.
type Options struct {
	// Dir is the absolute folder the server belongs to; its data goes to Dir/mariadb.
	Dir string
	// Port is the server's TCP port on 127.0.0.1; 0 takes the last run's port when it is
	// free, else any free port.
	Port int
	// LogPath receives the server's error log. Defaults to Dir/mariadb.log.
	LogPath string
	// Logger receives what was done to the data folder beyond starting the server (made,
	// or made again after an interrupted initialisation).
	Logger *slog.Logger
	// Programs are the server programs to use; when Server is empty, Start finds them
	// with FindPrograms.
	Programs Programs
}

// Programs are the installed programs a private server is made and run with.
type Programs struct {
	// Server is mariadbd, or mysqld: MariaDB's server under its older name, or Oracle
	// MySQL's.
	Server string
	// InstallDB is mariadb-install-db (or mysql_install_db), which makes MariaDB's data
	// folder; empty for MySQL, whose server makes it itself (mysqld --initialize-insecure).
	InstallDB string
	// Product is MariaDB or MySQL.
	Product string
}

// usualDirs are the folders, besides PATH, that FindPrograms looks in: Debian and Ubuntu
// keep mariadbd in /usr/sbin (not on a user's PATH), RHEL and Fedora keep mysqld and
// mariadbd in /usr/libexec, MySQL's own archive unpacks to /usr/local/mysql, Homebrew
// links into /opt/homebrew/bin or /usr/local/bin.
var usualDirs = []string{
	"/usr/sbin", "/usr/bin", "/usr/libexec", "/usr/local/sbin", "/usr/local/bin",
	"/usr/local/mysql/bin", "/usr/local/mariadb/bin", "/opt/homebrew/bin", "/opt/homebrew/sbin",
}

// InstallHint says how to get a server, or to do without one.
const InstallHint = `Install MariaDB (Debian/Ubuntu: apt-get install mariadb-server; Fedora: dnf install
mariadb-server; macOS: brew install mariadb) or MySQL, or set DATABASE_URL to a MySQL or
MariaDB database you already run (mysql://user:password@host:3306/outbox)`

// FindPrograms finds the server programs on PATH (through lookPath) or in the usual
// install folders: mariadbd and mariadb-install-db (or mysql_install_db) for MariaDB,
// else mysqld, which is MariaDB's server under its older name or Oracle MySQL's (its
// --version tells).
func FindPrograms(lookPath func(string) (string, error)) (Programs, error) {
	return findPrograms(lookPath, usualDirs, serverVersion)
}

func findPrograms(lookPath func(string) (string, error), dirs []string, version func(string) string) (Programs, error) {
	find := func(names ...string) string {
		for _, name := range names {
			if p, err := lookPath(name); err == nil && executable(p) {
				return p
			}
			for _, d := range dirs {
				if p := filepath.Join(d, name); executable(p) {
					return p
				}
			}
		}
		return ""
	}
	where := "on PATH or in " + strings.Join(dirs, ", ")
	server, product := find("mariadbd"), MariaDB
	if server == "" {
		if server = find("mysqld"); server == "" {
			return Programs{}, fmt.Errorf("no MariaDB or MySQL server program (mariadbd or mysqld) found %s.\n%s", where, InstallHint)
		}
		if !strings.Contains(version(server), "MariaDB") {
			product = MySQL
		}
	}
	if product == MySQL {
		return Programs{Server: server, Product: MySQL}, nil
	}
	installDB := find("mariadb-install-db", "mysql_install_db")
	if installDB == "" {
		return Programs{}, fmt.Errorf("found the MariaDB server %s, but not mariadb-install-db (or mysql_install_db), which makes its data folder, %s.\n%s", server, where, InstallHint)
	}
	return Programs{Server: server, InstallDB: installDB, Product: MariaDB}, nil
}

// executable reports whether path is a file anyone may run.
func executable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// serverVersion returns what server --version prints, as "mysqld  Ver 8.0.36 for Linux on
// x86_64 (MySQL Community Server - GPL)" or "mysqld  Ver 10.11.6-MariaDB-0+deb12u1 for
// debian-linux-gnu"; empty when it cannot be run.
func serverVersion(server string) string {
	out, _ := exec.Command(server, "--no-defaults", "--version").Output()
	return strings.TrimSpace(string(out))
}

// maxSocketPath is the longest Unix socket path every Unix system takes: the address
// holds 104 bytes on macOS and the BSDs (108 on Linux), the terminating NUL included.
const maxSocketPath = 103

// socketPath returns where the server of dir puts its Unix socket (which outbox dev does
// not use, but the server always opens): in dir when that path is short enough, else in
// the temporary folder, named after dir.
func socketPath(dir string) string {
	p := filepath.Join(dir, "mariadb.sock")
	if len(p) <= maxSocketPath {
		return p
	}
	sum := sha256.Sum256([]byte(dir))
	name := "outbox-mariadb-" + hex.EncodeToString(sum[:8]) + ".sock"
	if p = filepath.Join(os.TempDir(), name); len(p) <= maxSocketPath {
		return p
	}
	return filepath.Join("/tmp", name)
}

// userName is the name the server's --user option takes for the current user.
func userName(uid int, lookup func() (string, error)) string {
	if uid == 0 {
		return "root"
	}
	if name, err := lookup(); err == nil && name != "" {
		return name
	}
	return strconv.Itoa(uid)
}

// choosePort is localserver.ChoosePort, refusing a port given explicitly that is in use.
func choosePort(portFile string, port int) (int, error) {
	if port != 0 && !localserver.PortFree(port) {
		return 0, fmt.Errorf("port %d of the private MariaDB server on 127.0.0.1 is in use: choose another, or 0 for any free port", port)
	}
	return localserver.ChoosePort(portFile, port)
}

// dataState is what a data folder holds.
type dataState int

const (
	dataMissing dataState = iota // no folder, or an empty one
	dataServer                   // a whole data folder
)

// inspectDataDir tells what dataDir holds. A folder with files that is not a server's
// data folder is an error: it is never wiped or reused. So is a data folder made by the
// other product, which this server cannot open.
func inspectDataDir(dataDir, product string) (dataState, error) {
	entries, err := os.ReadDir(dataDir)
	if errors.Is(err, os.ErrNotExist) || (err == nil && len(entries) == 0) {
		return dataMissing, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read the MariaDB data folder %s: %w", dataDir, err)
	}
	exists := func(name string) bool { _, err := os.Stat(filepath.Join(dataDir, name)); return err == nil }
	if !exists("mysql") && !exists("mysql.ibd") {
		return 0, fmt.Errorf("%s is not a MariaDB or MySQL data folder (it has no mysql database), and outbox dev keeps its server's data there: move what it holds elsewhere, or choose another --dir", dataDir)
	}
	madeBy := ""
	switch {
	case exists("mysql.ibd"): // MySQL 8's data dictionary
		madeBy = MySQL
	case exists("aria_log_control"): // MariaDB's Aria engine, which its system tables use
		madeBy = MariaDB
	}
	if madeBy != "" && madeBy != product {
		return 0, fmt.Errorf("the data folder %s was made by %s, and the server installed here is %s, which cannot open it: wipe it with --reset, or install %s", dataDir, madeBy, product, madeBy)
	}
	return dataServer, nil
}
