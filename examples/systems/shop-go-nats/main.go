// The tutorial's shop in Go over NATS JetStream: an order API and workers
// that reserve inventory, each in two variants.
//
//	shop api    --listen HOST:PORT --db PATH --nats URL --variant naive|fixed
//	shop worker --db PATH --nats URL --id NAME --variant naive|fixed [--admin-listen HOST:PORT]
//
// naive: the API commits the order and then publishes its event (two writes);
// the workers' consumer acks on delivery (JetStream's AckNone) and keeps no
// inbox. fixed: the API writes the order and an outbox row in one
// transaction and a relay in the same process publishes the outbox with the
// event id as JetStream's Nats-Msg-Id; the workers ack explicitly, after an
// inbox row, the reservation and a ledger row committed in one transaction.
//
// Both serve haunt's admin protocol through clients/go when HAUNT_ADMIN_TOKEN
// is set: the API beside /orders, a worker on --admin-listen.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/google/uuid"
	hauntadmin "github.com/haunt-chaos/haunt/clients/go"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	_ "modernc.org/sqlite"
)

const (
	stream   = "ORDERS"
	subject  = "orders.placed"
	consumer = "workers"
)

type config struct {
	role, listen, db, natsURL, id, variant, adminListen string
	visibility                                          time.Duration
}

func main() {
	if len(os.Args) < 2 || (os.Args[1] != "api" && os.Args[1] != "worker") {
		fmt.Fprintln(os.Stderr, "usage: shop api|worker [flags] (shop api -h)")
		os.Exit(2)
	}
	c := config{role: os.Args[1]}
	fs := flag.NewFlagSet(c.role, flag.ExitOnError)
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8080", "api: where to serve /orders (and the admin protocol)")
	fs.StringVar(&c.db, "db", "", "the SQLite file (created if missing)")
	fs.StringVar(&c.natsURL, "nats", "nats://127.0.0.1:4222", "the NATS server")
	fs.StringVar(&c.id, "id", "worker-1", "worker: its name (the ledger's worker_id)")
	fs.StringVar(&c.variant, "variant", "", "naive or fixed")
	fs.StringVar(&c.adminListen, "admin-listen", "", "worker: where to serve haunt's admin protocol")
	fs.DurationVar(&c.visibility, "visibility-timeout", 2*time.Second, "worker: JetStream's ack wait")
	_ = fs.Parse(os.Args[2:])
	if c.db == "" || (c.variant != "naive" && c.variant != "fixed") {
		fmt.Fprintln(os.Stderr, "shop: --db and --variant naive|fixed are required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var err error
	if c.role == "api" {
		err = runAPI(ctx, c)
	} else {
		err = runWorker(ctx, c)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Fatalf("%s: %v", c.role, err)
	}
}

// openDB opens the SQLite file in WAL mode and creates the schema; every
// statement is IF NOT EXISTS, so any process may come first. SQLite answers
// some lock conflicts SQLITE_BUSY at once, without waiting on the busy
// timeout, and three processes opening a new file together under load met
// both (a worker died at start):
//   - switching the file to WAL, which one process does and the others find
//     done: retried for a few seconds;
//   - a deferred transaction's upgrade from reading to writing: every
//     transaction begins IMMEDIATE instead, taking the write lock at once.
func openDB(path string) (*sql.DB, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_txlock=immediate")
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1) // one writer per process; processes wait on the busy timeout
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, err = db.Exec(`PRAGMA journal_mode=WAL`)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("journal_mode=WAL: %w", err)
	}
	tx, err := db.Begin()
	if err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	for _, stmt := range []string{
		`CREATE TABLE IF NOT EXISTS orders (order_id TEXT PRIMARY KEY, item_id TEXT NOT NULL,
			qty INTEGER NOT NULL, event_id TEXT NOT NULL UNIQUE)`,
		`CREATE TABLE IF NOT EXISTS outbox (event_id TEXT PRIMARY KEY, payload TEXT NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS inventory (item_id TEXT PRIMARY KEY, reserved_qty INTEGER NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS inbox (event_id TEXT PRIMARY KEY)`,
		`CREATE TABLE IF NOT EXISTS ledger (event_id TEXT NOT NULL, order_id TEXT NOT NULL, item_id TEXT NOT NULL,
			qty INTEGER NOT NULL, delivery_attempt INTEGER NOT NULL, worker_id TEXT NOT NULL, applied_at_ms INTEGER NOT NULL)`,
	} {
		if _, err := tx.Exec(stmt); err != nil {
			return nil, fmt.Errorf("schema: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	return db, nil
}

// connect reaches NATS and makes sure the stream exists, retrying while the
// server starts (it is a node of the same run).
func connect(ctx context.Context, url string) (*nats.Conn, jetstream.JetStream, jetstream.Stream, error) {
	for {
		nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
		if err == nil {
			js, err := jetstream.New(nc)
			if err == nil {
				var s jetstream.Stream
				s, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
					Name: stream, Subjects: []string{subject}, Storage: jetstream.FileStorage,
					Duplicates: 2 * time.Minute,
				})
				if err == nil {
					return nc, js, s, nil
				}
			}
			nc.Close()
		}
		log.Printf("waiting for NATS at %s: %v", url, err)
		select {
		case <-ctx.Done():
			return nil, nil, nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

type order struct {
	OrderID string `json:"order_id"`
	ItemID  string `json:"item_id"`
	Qty     int64  `json:"qty"`
	EventID string `json:"event_id,omitempty"`
}

// ---- the API ---------------------------------------------------------------

const apiPoint = "after-order-before-publish"

func runAPI(ctx context.Context, c config) error {
	db, err := openDB(c.db)
	if err != nil {
		return err
	}
	nc, js, _, err := connect(ctx, c.natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	admin := hauntadmin.New([]string{apiPoint})
	if c.variant == "fixed" {
		go relay(ctx, db, js)
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/", admin)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/quiet", func(w http.ResponseWriter, r *http.Request) { quiet(r.Context(), w, db, js) })
	mux.HandleFunc("/orders", func(w http.ResponseWriter, r *http.Request) { placeOrder(w, r, c, db, js, admin) })
	server := &http.Server{Addr: c.listen, Handler: mux}
	go func() { <-ctx.Done(); _ = server.Close() }()
	log.Printf("api variant=%s listening on %s", c.variant, c.listen)
	return server.ListenAndServe()
}

func reply(w http.ResponseWriter, status int, body any) {
	w.Header().Set("content-type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

func placeOrder(w http.ResponseWriter, r *http.Request, c config, db *sql.DB, js jetstream.JetStream, admin *hauntadmin.Admin) {
	if r.Method != http.MethodPost {
		reply(w, 405, map[string]any{"error": "POST only", "field": nil})
		return
	}
	var o order
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil {
		reply(w, 400, map[string]any{"error": err.Error(), "field": "body"})
		return
	}
	for _, check := range []struct {
		field string
		bad   bool
	}{{"order_id", o.OrderID == ""}, {"item_id", o.ItemID == ""}, {"qty", o.Qty < 1}} {
		if check.bad {
			reply(w, 400, map[string]any{"error": check.field + " is missing or not positive", "field": check.field})
			return
		}
	}
	var prior order
	err := db.QueryRow(`SELECT item_id, qty, event_id FROM orders WHERE order_id = ?`, o.OrderID).
		Scan(&prior.ItemID, &prior.Qty, &prior.EventID)
	if err == nil {
		if prior.ItemID != o.ItemID || prior.Qty != o.Qty {
			reply(w, 409, map[string]any{"error": "order_id exists with another item or qty", "field": "order_id"})
			return
		}
		reply(w, 200, map[string]any{"order_id": o.OrderID, "event_id": prior.EventID})
		return
	}
	o.EventID = uuid.NewString()
	payload, _ := json.Marshal(o)
	if c.variant == "naive" {
		// Two writes: the order commits, then the event is published. A crash
		// between them leaves an order no worker will ever hear of.
		if _, err := db.Exec(`INSERT INTO orders VALUES (?, ?, ?, ?)`, o.OrderID, o.ItemID, o.Qty, o.EventID); err != nil {
			reply(w, 503, map[string]any{"error": err.Error()})
			return
		}
		admin.Reached(apiPoint, map[string]any{"order_id": o.OrderID})
		if _, err := js.Publish(r.Context(), subject, payload); err != nil {
			reply(w, 503, map[string]any{"error": "publish: " + err.Error()})
			return
		}
	} else {
		// The transactional outbox: the order and its event commit together;
		// the relay publishes the event.
		tx, err := db.Begin()
		if err == nil {
			_, err = tx.Exec(`INSERT INTO orders VALUES (?, ?, ?, ?)`, o.OrderID, o.ItemID, o.Qty, o.EventID)
		}
		if err == nil {
			admin.Reached(apiPoint, map[string]any{"order_id": o.OrderID})
			_, err = tx.Exec(`INSERT INTO outbox VALUES (?, ?)`, o.EventID, string(payload))
		}
		if err == nil {
			err = tx.Commit()
		} else if tx != nil {
			_ = tx.Rollback()
		}
		if err != nil {
			reply(w, 503, map[string]any{"error": err.Error()})
			return
		}
	}
	reply(w, 201, map[string]any{"order_id": o.OrderID, "event_id": o.EventID})
}

// relay publishes the outbox, each event with its id as Nats-Msg-Id (a
// publish repeated after a crash is dropped by the stream's duplicate
// window), and deletes each row once the stream has it.
func relay(ctx context.Context, db *sql.DB, js jetstream.JetStream) {
	for ctx.Err() == nil {
		rows, err := db.Query(`SELECT event_id, payload FROM outbox LIMIT 100`)
		var batch [][2]string
		if err == nil {
			for rows.Next() {
				var e, p string
				if rows.Scan(&e, &p) == nil {
					batch = append(batch, [2]string{e, p})
				}
			}
			_ = rows.Close()
		}
		for _, row := range batch {
			if _, err := js.Publish(ctx, subject, []byte(row[1]), jetstream.WithMsgID(row[0])); err != nil {
				break
			}
			_, _ = db.Exec(`DELETE FROM outbox WHERE event_id = ?`, row[0])
		}
		if len(batch) == 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// quiet answers 200 once nothing is left to deliver: no outbox row, nothing
// pending or unacked at the consumer; 503 otherwise.
func quiet(ctx context.Context, w http.ResponseWriter, db *sql.DB, js jetstream.JetStream) {
	var outbox int
	_ = db.QueryRow(`SELECT count(*) FROM outbox`).Scan(&outbox)
	cons, err := js.Consumer(ctx, stream, consumer)
	if err != nil {
		// No worker has made the consumer yet: quiet only if nothing was published.
		s, serr := js.Stream(ctx, stream)
		if serr == nil && s.CachedInfo().State.Msgs == 0 && outbox == 0 {
			reply(w, 200, map[string]any{"quiet": true})
			return
		}
		reply(w, 503, map[string]any{"quiet": false, "error": fmt.Sprint(err)})
		return
	}
	info, err := cons.Info(ctx)
	if err != nil || outbox > 0 || info.NumPending > 0 || info.NumAckPending > 0 {
		reply(w, 503, map[string]any{"quiet": false, "outbox": outbox})
		return
	}
	reply(w, 200, map[string]any{"quiet": true})
}

// ---- a worker --------------------------------------------------------------

const (
	deliveredPoint = "after-delivery"
	workerPoint    = "after-effect-before-ack"
)

func runWorker(ctx context.Context, c config) error {
	db, err := openDB(c.db)
	if err != nil {
		return err
	}
	nc, _, s, err := connect(ctx, c.natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	admin := hauntadmin.New([]string{deliveredPoint, workerPoint}, "ack_fail_rate")
	if c.adminListen != "" {
		go func() { log.Print(admin.ListenAndServe(c.adminListen)) }()
	}
	policy := jetstream.AckExplicitPolicy
	if c.variant == "naive" {
		policy = jetstream.AckNonePolicy // acked as delivered: at most once
	}
	cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: consumer, AckPolicy: policy, AckWait: c.visibility, MaxDeliver: 10,
	})
	if err != nil {
		return err
	}
	log.Printf("%s variant=%s consuming", c.id, c.variant)
	for ctx.Err() == nil {
		batch, err := cons.Fetch(10, jetstream.FetchMaxWait(500*time.Millisecond))
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for msg := range batch.Messages() {
			handle(c, db, admin, msg)
		}
	}
	return ctx.Err()
}

func handle(c config, db *sql.DB, admin *hauntadmin.Admin, msg jetstream.Msg) {
	var o order
	if err := json.Unmarshal(msg.Data(), &o); err != nil {
		_ = msg.Term() // a poison message: never deliverable
		return
	}
	meta, _ := msg.Metadata()
	attempt := uint64(1)
	if meta != nil {
		attempt = meta.NumDelivered
	}
	// Delivered and not applied: under AckNone (naive) already acked, so a
	// crash here loses it; under AckExplicit it comes back after the ack wait.
	admin.Reached(deliveredPoint, map[string]any{"event_id": o.EventID})
	if err := apply(c, db, o, attempt); err != nil {
		log.Printf("%s: applying %s: %v", c.id, o.EventID, err)
		_ = msg.Nak()
		return
	}
	admin.Reached(workerPoint, map[string]any{"event_id": o.EventID})
	if c.variant == "fixed" && !admin.DropAck() {
		_ = msg.Ack()
	}
}

// apply reserves the order's quantity. fixed: inbox, reservation and ledger
// in one transaction, a redelivery a no-op. naive: no inbox, every delivery
// applies.
func apply(c config, db *sql.DB, o order, attempt uint64) error {
	tx, err := db.Begin()
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if c.variant == "fixed" {
		res, err := tx.Exec(`INSERT INTO inbox VALUES (?) ON CONFLICT DO NOTHING`, o.EventID)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return tx.Commit() // applied before: only its ack was lost
		}
	}
	if _, err := tx.Exec(`INSERT INTO inventory VALUES (?, ?) ON CONFLICT(item_id)
		DO UPDATE SET reserved_qty = reserved_qty + excluded.reserved_qty`, o.ItemID, o.Qty); err != nil {
		return err
	}
	if _, err := tx.Exec(`INSERT INTO ledger VALUES (?, ?, ?, ?, ?, ?, ?)`, o.EventID, o.OrderID, o.ItemID, o.Qty,
		attempt, c.id, time.Now().UnixMilli()); err != nil {
		return err
	}
	return tx.Commit()
}
