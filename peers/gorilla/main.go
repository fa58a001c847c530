// The gorilla/websocket echo server, a peer for `freeboard bench --peers`: every message goes
// back as it came. Listens on the address given as argument; run with GOMAXPROCS=1.
package main

import (
	"log"
	"net/http"
	"os"

	"github.com/gorilla/websocket"
)

var upgrader = websocket.Upgrader{ReadBufferSize: 4096, WriteBufferSize: 4096}

func echo(w http.ResponseWriter, r *http.Request) {
	c, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	defer c.Close()
	for {
		kind, message, err := c.ReadMessage()
		if err != nil {
			return
		}
		if err := c.WriteMessage(kind, message); err != nil {
			return
		}
	}
}

func main() {
	addr := "127.0.0.1:9006"
	if len(os.Args) > 1 {
		addr = os.Args[1]
	}
	http.HandleFunc("/", echo)
	log.Fatal(http.ListenAndServe(addr, nil))
}
