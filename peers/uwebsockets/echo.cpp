// uWebSockets echo for side-by-side runs (build.sh beside it): every message echoed as it
// came, compression off, one thread, on 127.0.0.1; the port is the only argument.
#include "App.h"
#include <cstdlib>
#include <iostream>
int main(int argc, char **argv) {
    int port = argc > 1 ? atoi(argv[1]) : 9003;
    struct Data {};
    uWS::App().ws<Data>("/*", {
        .compression = uWS::DISABLED,
        .maxPayloadLength = 16 * 1024 * 1024,
        .idleTimeout = 120,
        .maxBackpressure = 16 * 1024 * 1024,
        .sendPingsAutomatically = false,
        .message = [](auto *ws, std::string_view message, uWS::OpCode opCode) {
            ws->send(message, opCode, false);
        },
    }).listen("127.0.0.1", port, [port](auto *s) {
        if (s) std::cout << "listening on " << port << std::endl;
    }).run();
}
