//! The server's TLS connection on rustls' unbuffered API (the `tls` feature), with every
//! buffer in the loop's pool: the loop's scratch buffers ([`TlsScratch`]) and the pool chunks
//! of a connection ([`TlsStream`]), as the module above describes.

use std::fmt;
use std::io::{self, IoSlice, Read, Write};
use std::net::{IpAddr, Shutdown};
use std::sync::Arc;

use freeboard_buf::{Budget, ChunkChain};
use mio::net::TcpStream;
use rustls::HandshakeKind::Resumed;
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, EncodeError, EncryptError, UnbufferedStatus};

use crate::session::Session;

use super::admission::{HandshakeAdmission, HandshakeTicket};
use super::{HANDSHAKE_CHARGE, Io};

/// Ciphertext read per call, after what is left of a partial record (at most one record,
/// 16 KiB + 2 KiB).
const READ_SIZE: usize = 64 * 1024;
/// The largest TLS record on the wire: 2^14 bytes of plaintext plus at most 2,048 of
/// expansion (RFC 8446 §5.2, RFC 5246 §6.2.3).
const MAX_RECORD: usize = 5 + 16 * 1024 + 2048;
/// Plaintext encrypted per write: the ciphertext of one `write` call.
const WRITE_SIZE: usize = 64 * 1024;

/// What an established TLS connection's rustls state holds (the record layer's keys and
/// sequence numbers, the session's secrets), charged from the end of the handshake to close.
/// Measured: 3.2 KiB.
pub(crate) const ESTABLISHED_CHARGE: usize = 4 * 1024;

/// The rustls configuration the server accepts TLS connections with.
pub(crate) type ServerTls = Arc<rustls::ServerConfig>;

/// The loop's TLS buffers, shared by all its TLS connections (one runs at a time).
pub(crate) struct TlsScratch {
    /// Received ciphertext: a partial record put back, then one read.
    input: Box<[u8]>,
    /// Ciphertext to send: a handshake flight, or one write's worth of records.
    output: Box<[u8]>,
    /// The queue's slices gathered before they are encrypted, so that many small messages
    /// make one full record (16 KiB), not one record each.
    plain: Box<[u8]>,
    /// What the connections' rustls state may use: a share of the loop's memory budget.
    budget: Budget,
    /// Every address's share of the handshakes, across the server.
    handshakes: Option<Arc<HandshakeAdmission>>,
}

impl TlsScratch {
    /// The bytes a loop with TLS draws from its budget for its scratch buffers.
    pub(crate) const BYTES: usize = MAX_RECORD + READ_SIZE + 2 * WRITE_SIZE + WRITE_SIZE / 4;

    /// Scratch buffers, `state_budget` for the connections' rustls state, and the server's
    /// per-address `handshakes`.
    pub(crate) fn new(state_budget: Budget, handshakes: Arc<HandshakeAdmission>) -> Self {
        Self {
            input: vec![0; MAX_RECORD + READ_SIZE].into_boxed_slice(),
            output: vec![0; WRITE_SIZE + WRITE_SIZE / 4].into_boxed_slice(),
            plain: vec![0; WRITE_SIZE].into_boxed_slice(),
            budget: state_budget,
            handshakes: Some(handshakes),
        }
    }

    /// A loop without TLS: no buffers.
    pub(crate) fn none() -> Self {
        Self {
            input: Box::new([]),
            output: Box::new([]),
            plain: Box::new([]),
            budget: Budget::new(0),
            handshakes: None,
        }
    }
}

/// A server-side TLS connection over a TCP socket.
pub(crate) struct TlsStream {
    conn: UnbufferedServerConnection,
    wire: Wire,
}

/// Everything of a [`TlsStream`] but the rustls state, so it can be used while a rustls
/// state borrows the connection.
struct Wire {
    tcp: TcpStream,
    /// Ciphertext of a record that has not fully arrived (or of a handshake message rustls
    /// asked to keep), put back at the front of the input scratch on the next read.
    cipher_in: ChunkChain,
    /// Decrypted bytes the caller's buffer had no room for; read before anything else.
    plain_in: ChunkChain,
    /// Encrypted bytes the socket did not take; written before anything else.
    cipher_out: ChunkChain,
    /// The last read filled the input scratch: the socket may hold more.
    more_input: bool,
    /// The first bytes arrived (and looked like TLS).
    started: bool,
    /// The handshake is done (application data may flow).
    established: bool,
    /// The peer sent close_notify, or the stream ended.
    peer_closed: bool,
    /// Our FIN waits for `cipher_out` to empty.
    fin_pending: bool,
    /// A fatal error was reported (and counted); the connection is going.
    failed: bool,
    /// What this connection holds of the loop's TLS budget for its rustls state.
    charge: usize,
    /// What it holds of the TLS budget for `cipher_in` before the handshake ends (whole
    /// chunks): a ClientHello sent slowly is bounded by the TLS share, not the pool's.
    held: usize,
    /// Its place in its address's share of the handshakes, until the handshake ends.
    ticket: Option<HandshakeTicket>,
}

impl TlsStream {
    /// Wraps an accepted socket, or `None` (counted) when `client`'s address is at its share
    /// of the handshakes or the loop's TLS budget cannot cover one more. `client` is `None`
    /// for a connection whose client is named later (a trusted proxy): it is not counted.
    pub(crate) fn accept(
        tcp: TcpStream,
        config: &ServerTls,
        io: &mut Io<'_>,
        client: Option<IpAddr>,
    ) -> Option<Self> {
        // The address's share first: a refused address draws nothing from the budget.
        let ticket = match (client, &io.tls.handshakes) {
            (Some(client), Some(handshakes)) => match handshakes.begin(client) {
                Ok(ticket) => Some(ticket),
                Err(reason) => {
                    io.metrics.tls_refusal(reason);
                    return None;
                }
            },
            _ => None,
        };
        if io.tls.budget.try_draw(HANDSHAKE_CHARGE).is_err() {
            io.metrics.tls_refusal("budget");
            return None;
        }
        match UnbufferedServerConnection::new(config.clone()) {
            Ok(conn) => Some(Self::new(tcp, conn, ticket)),
            Err(_) => {
                io.tls.budget.give_back(HANDSHAKE_CHARGE);
                io.metrics.tls_refusal("other");
                None
            }
        }
    }

    fn new(
        tcp: TcpStream,
        conn: UnbufferedServerConnection,
        ticket: Option<HandshakeTicket>,
    ) -> Self {
        let wire = Wire {
            tcp,
            cipher_in: ChunkChain::new(),
            plain_in: ChunkChain::new(),
            cipher_out: ChunkChain::new(),
            more_input: false,
            started: false,
            established: false,
            peer_closed: false,
            fin_pending: false,
            failed: false,
            charge: HANDSHAKE_CHARGE,
            held: 0,
            ticket,
        };
        Self { conn, wire }
    }

    pub(crate) fn tcp(&mut self) -> &mut TcpStream {
        &mut self.wire.tcp
    }

    /// Whether the handshake finished.
    pub(crate) fn established(&self) -> bool {
        self.wire.established
    }

    /// Whether the socket or the buffers may hold more input than the last read returned.
    pub(crate) fn more_input(&self) -> bool {
        self.wire.more_input || !self.wire.plain_in.is_empty()
    }

    /// Reads decrypted bytes into `buf`. `Ok(0)` is the end of the stream (close_notify or
    /// FIN); `WouldBlock` means no whole record is there yet. A TLS error is counted, its
    /// alert sent, and reported as `InvalidData`.
    pub(crate) fn read(&mut self, io: &mut Io<'_>, buf: &mut [u8]) -> io::Result<usize> {
        let wire = &mut self.wire;
        if buf.is_empty() {
            return Ok(0);
        }
        if !wire.plain_in.is_empty() {
            let n = wire.plain_in.copy_to(io.pool, buf);
            wire.plain_in.consume(io.pool, n);
            return Ok(n);
        }
        if wire.failed {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "TLS failed"));
        }
        wire.more_input = false;
        loop {
            let wire = &mut self.wire;
            if wire.peer_closed {
                return Ok(0);
            }
            let input = &mut io.tls.input;
            let kept = wire.cipher_in.copy_to(io.pool, input);
            wire.cipher_in.clear(io.pool);
            io.tls.budget.give_back(std::mem::take(&mut wire.held));
            let (read, eof) = match wire.tcp.read(&mut input[kept..]) {
                Ok(0) => (0, true),
                Ok(n) => (n, false),
                Err(e) => {
                    wire.keep_input(io, 0, kept)?;
                    return Err(e);
                }
            };
            let space = input.len() - kept;
            if !wire.started && read > 0 {
                // The first byte of a ClientHello record is 0x16 (handshake).
                if input[0] != 0x16 {
                    return Err(wire.not_tls(io, read));
                }
                wire.started = true;
            }
            let n = self.process(io, kept + read, buf)?;
            let wire = &mut self.wire;
            if eof {
                wire.peer_closed = true;
                return Ok(n);
            }
            if n > 0 || wire.peer_closed {
                wire.more_input = read == space;
                return Ok(n);
            }
            // No plaintext yet (a record, or a ClientHello, that has not fully arrived): read
            // again, even after a short read, until the socket says `WouldBlock`. Epoll is
            // edge-triggered, so a FIN that came with these bytes raises no new event: a
            // client that sent half a ClientHello and hung up would otherwise hold its
            // handshake, and its address's place, until the handshake timeout.
        }
    }

    /// Runs rustls over `io.tls.input[..end]`: sends what the handshake owes, copies
    /// plaintext into `buf` (the rest into `plain_in`), keeps an incomplete record. Returns
    /// the plaintext bytes put into `buf`.
    fn process(&mut self, io: &mut Io<'_>, end: usize, buf: &mut [u8]) -> io::Result<usize> {
        let Self { conn, wire } = self;
        let mut start = 0;
        let mut filled = 0;
        let mut out = 0;
        let was_established = wire.established;
        loop {
            let UnbufferedStatus { mut discard, state } =
                conn.process_tls_records(&mut io.tls.input[start..end]);
            let state = match state {
                Ok(state) => state,
                Err(e) => return Err(fail(conn, wire, io, out, e)),
            };
            let done = match state {
                ConnectionState::ReadTraffic(mut traffic) => {
                    while let Some(record) = traffic.next_record() {
                        let record = match record {
                            Ok(record) => record,
                            Err(e) => {
                                drop(traffic);
                                return Err(fail(conn, wire, io, out, e));
                            }
                        };
                        discard += record.discard;
                        let payload = record.payload;
                        let n = payload.len().min(buf.len() - filled);
                        buf[filled..filled + n].copy_from_slice(&payload[..n]);
                        filled += n;
                        if n < payload.len()
                            && wire.plain_in.append(io.pool, &payload[n..]).is_err()
                        {
                            return Err(wire.out_of_memory(io));
                        }
                    }
                    false
                }
                ConnectionState::EncodeTlsData(mut encode) => {
                    let mut encoded = encode.encode(&mut io.tls.output[out..]);
                    if let Err(EncodeError::InsufficientSize(_)) = encoded
                        && out > 0
                    {
                        // Send what is there to make room.
                        wire.send(io, out)?;
                        out = 0;
                        encoded = encode.encode(&mut io.tls.output[..]);
                    }
                    match encoded {
                        Ok(n) => out += n,
                        Err(EncodeError::AlreadyEncoded) => {}
                        Err(_) => {
                            drop(encode);
                            return Err(fail(conn, wire, io, 0, rustls::Error::EncryptError));
                        }
                    }
                    false
                }
                ConnectionState::TransmitTlsData(transmit) => {
                    transmit.done();
                    wire.send(io, out)?;
                    out = 0;
                    false
                }
                ConnectionState::WriteTraffic(_) => {
                    if !wire.established {
                        wire.established = true;
                        wire.ticket = None; // the address's place goes back
                        io.metrics.tls_handshakes.inc();
                        io.tls.budget.give_back(wire.charge - ESTABLISHED_CHARGE);
                        wire.charge = ESTABLISHED_CHARGE;
                    }
                    true
                }
                ConnectionState::PeerClosed | ConnectionState::Closed => {
                    wire.peer_closed = true;
                    true
                }
                // BlockedHandshake wants more input; early data is not enabled.
                _ => true,
            };
            start += discard;
            if done {
                break;
            }
        }
        if wire.established && !was_established && conn.handshake_kind() == Some(Resumed) {
            io.metrics.tls_resumptions.inc();
        }
        wire.send(io, out)?;
        wire.keep_input(io, start, end)?;
        Ok(filled)
    }

    /// Writes what waits in `cipher_out`; `true` once it is empty (then a pending FIN goes).
    pub(crate) fn write_pending(&mut self, io: &mut Io<'_>) -> io::Result<bool> {
        self.wire.write_pending(io)
    }

    /// Encrypts and writes the session's queue: at most [`WRITE_SIZE`] of plaintext per
    /// call, gathered from the queue's slices and cut into full records (16 KiB). Returns the
    /// plaintext bytes taken from the queue and whether the socket took everything.
    pub(crate) fn write_queue(
        &mut self,
        session: &mut Session,
        io: &mut Io<'_>,
    ) -> io::Result<(usize, bool)> {
        let Self { conn, wire } = self;
        if !wire.write_pending(io)? || !wire.established || !settle(conn, wire, io)? {
            return Ok((0, false));
        }
        let mut taken = 0;
        let out = {
            let UnbufferedStatus { state, .. } = conn.process_tls_records(&mut []);
            let Ok(ConnectionState::WriteTraffic(mut traffic)) = state else {
                return Ok((0, false));
            };
            let mut iov = [IoSlice::new(&[]); 256];
            let n = session.io_slices(io.pool, &mut iov);
            let plain = &mut io.tls.plain;
            for slice in &iov[..n] {
                let len = slice.len().min(plain.len() - taken);
                plain[taken..taken + len].copy_from_slice(&slice[..len]);
                taken += len;
                if taken == plain.len() {
                    break;
                }
            }
            match traffic.encrypt(&plain[..taken], &mut io.tls.output) {
                Ok(n) => n,
                Err(EncryptError::InsufficientSize(_)) => return Ok((0, false)),
                Err(_) => return Err(io::Error::new(io::ErrorKind::InvalidData, "TLS encrypt")),
            }
        };
        session.consume(io.pool, taken);
        wire.send(io, out)?;
        Ok((taken, wire.cipher_out.is_empty()))
    }

    /// Encrypts and writes `bufs` (a response written without the queue).
    pub(crate) fn write_vectored(
        &mut self,
        io: &mut Io<'_>,
        bufs: &[IoSlice<'_>],
    ) -> io::Result<usize> {
        let Self { conn, wire } = self;
        if !wire.established || !settle(conn, wire, io)? {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let mut taken = 0;
        let mut out = 0;
        {
            let UnbufferedStatus { state, .. } = conn.process_tls_records(&mut []);
            let Ok(ConnectionState::WriteTraffic(mut traffic)) = state else {
                return Err(io::ErrorKind::WouldBlock.into());
            };
            for slice in bufs {
                match traffic.encrypt(slice, &mut io.tls.output[out..]) {
                    Ok(n) => out += n,
                    Err(_) => break,
                }
                taken += slice.len();
            }
        }
        wire.send(io, out)?;
        Ok(taken)
    }

    /// Sends close_notify, then our FIN once everything before it is out.
    pub(crate) fn shutdown_write(&mut self, io: &mut Io<'_>) -> io::Result<()> {
        let Self { conn, wire } = self;
        let mut out = 0;
        if wire.established && !wire.failed {
            let UnbufferedStatus { state, .. } = conn.process_tls_records(&mut []);
            if let Ok(ConnectionState::WriteTraffic(mut traffic)) = state {
                out = traffic.queue_close_notify(&mut io.tls.output).unwrap_or(0);
            }
        }
        wire.fin_pending = true;
        wire.send(io, out)?;
        wire.write_pending(io).map(|_| ())
    }

    /// Returns the connection's chunks to the pool and its charge to the TLS budget.
    pub(crate) fn release(&mut self, io: &mut Io<'_>) {
        let wire = &mut self.wire;
        wire.cipher_in.clear(io.pool);
        wire.plain_in.clear(io.pool);
        wire.cipher_out.clear(io.pool);
        io.tls.budget.give_back(std::mem::take(&mut wire.charge) + std::mem::take(&mut wire.held));
        wire.ticket = None;
    }
}

/// Sends what rustls owes before application data (a session ticket, a key update's
/// answer); `true` once it may encrypt.
fn settle(
    conn: &mut UnbufferedServerConnection,
    wire: &mut Wire,
    io: &mut Io<'_>,
) -> io::Result<bool> {
    let mut out = 0;
    loop {
        let UnbufferedStatus { state, .. } = conn.process_tls_records(&mut []);
        match state {
            Ok(ConnectionState::WriteTraffic(_)) => break,
            Ok(ConnectionState::EncodeTlsData(mut encode)) => {
                match encode.encode(&mut io.tls.output[out..]) {
                    Ok(n) => out += n,
                    Err(_) => return Ok(false),
                }
            }
            Ok(ConnectionState::TransmitTlsData(transmit)) => {
                transmit.done();
                wire.send(io, out)?;
                out = 0;
            }
            Ok(_) => return Ok(false),
            Err(e) => return Err(fail(conn, wire, io, out, e)),
        }
    }
    wire.send(io, out)?;
    Ok(true)
}

/// A TLS error: counted by kind, its alert (if rustls has one) sent, the connection failed.
fn fail(
    conn: &mut UnbufferedServerConnection,
    wire: &mut Wire,
    io: &mut Io<'_>,
    pending: usize,
    error: rustls::Error,
) -> io::Error {
    wire.failed = true;
    io.metrics.tls_refusal(error_reason(&error, wire.established));
    tracing::debug!(%error, "TLS error");
    // What the handshake had encoded, then the alert rustls queued for the error.
    let mut out = pending;
    for _ in 0..4 {
        let UnbufferedStatus { state, .. } = conn.process_tls_records(&mut []);
        match state {
            Ok(ConnectionState::EncodeTlsData(mut encode)) => {
                if let Ok(n) = encode.encode(&mut io.tls.output[out..]) {
                    out += n;
                }
            }
            Ok(ConnectionState::TransmitTlsData(transmit)) => transmit.done(),
            _ => break,
        }
    }
    let _ = wire.send(io, out);
    let _ = wire.write_pending(io);
    io::Error::new(io::ErrorKind::InvalidData, error)
}

impl Wire {
    /// Keeps `io.tls.input[start..end]` (an incomplete record) in pool chunks; before the
    /// handshake ends, only as far as the TLS budget covers them.
    fn keep_input(&mut self, io: &mut Io<'_>, start: usize, end: usize) -> io::Result<()> {
        if start == end {
            return Ok(());
        }
        if !self.established {
            let held = (end - start).div_ceil(io.pool.chunk_size()) * io.pool.chunk_size();
            if io.tls.budget.try_draw(held).is_err() {
                self.failed = true;
                io.metrics.tls_refusal("budget");
                return Err(io::Error::new(io::ErrorKind::OutOfMemory, "TLS budget"));
            }
            self.held = held;
        }
        if self.cipher_in.append(io.pool, &io.tls.input[start..end]).is_err() {
            return Err(self.out_of_memory(io));
        }
        Ok(())
    }

    /// Sends `io.tls.output[..len]` after whatever waits in `cipher_out`; keeps what the
    /// socket does not take.
    fn send(&mut self, io: &mut Io<'_>, len: usize) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let mut sent = 0;
        if self.write_pending(io)? {
            while sent < len {
                match self.tcp.write(&io.tls.output[sent..len]) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => sent += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
        if sent < len && self.cipher_out.append(io.pool, &io.tls.output[sent..len]).is_err() {
            return Err(self.out_of_memory(io));
        }
        Ok(())
    }

    fn write_pending(&mut self, io: &mut Io<'_>) -> io::Result<bool> {
        while !self.cipher_out.is_empty() {
            let mut iov = [IoSlice::new(&[]); 64];
            let n = self.cipher_out.io_slices(io.pool, &mut iov);
            match self.tcp.write_vectored(&iov[..n]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(written) => {
                    self.cipher_out.consume(io.pool, written);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if self.fin_pending {
            self.fin_pending = false;
            let _ = self.tcp.shutdown(Shutdown::Write);
        }
        Ok(true)
    }

    /// The first bytes are not a TLS handshake record. Plain HTTP gets a plain 400 saying
    /// what to use; anything else the handshake_failure alert.
    fn not_tls(&mut self, io: &mut Io<'_>, read: usize) -> io::Error {
        self.failed = true;
        let start = &io.tls.input[..read.min(8)];
        let http = start.iter().take_while(|b| b.is_ascii_uppercase()).count() >= 3
            && start.get(3..).is_some_and(|rest| rest.contains(&b' '));
        if http {
            io.metrics.tls_refusal("plain_http");
            let _ = self.tcp.write(PLAIN_HTTP_RESPONSE);
        } else {
            io.metrics.tls_refusal("not_tls");
            // A fatal handshake_failure alert in a plaintext record.
            let _ = self.tcp.write(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28]);
        }
        let _ = self.tcp.shutdown(Shutdown::Write);
        io::Error::new(io::ErrorKind::InvalidData, "not TLS")
    }

    fn out_of_memory(&mut self, io: &mut Io<'_>) -> io::Error {
        self.failed = true;
        io.metrics.tls_refusal("pool_exhausted");
        io::Error::new(io::ErrorKind::OutOfMemory, "pool exhausted")
    }
}

impl fmt::Debug for TlsStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsStream")
            .field("established", &self.wire.established)
            .field("cipher_in", &self.wire.cipher_in.len())
            .field("plain_in", &self.wire.plain_in.len())
            .field("cipher_out", &self.wire.cipher_out.len())
            .finish_non_exhaustive()
    }
}

const PLAIN_HTTP_RESPONSE: &[u8] = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\n\
Content-Length: 52\r\nConnection: close\r\n\r\nThis port speaks TLS: use https:// or wss:// here.\n\n";

/// The counter label of a TLS error: bounded (an alert's name, or one of a few kinds).
fn error_reason(error: &rustls::Error, established: bool) -> &'static str {
    use rustls::Error as E;
    match error {
        E::InvalidMessage(_) if !established => "bad_client_hello",
        E::InvalidMessage(_) => "bad_record",
        E::AlertReceived(alert) => alert_reason(*alert),
        E::NoApplicationProtocol => "no_application_protocol",
        E::PeerIncompatible(_) => "peer_incompatible",
        E::PeerMisbehaved(_) => "peer_misbehaved",
        E::DecryptError => "decrypt_error",
        E::InappropriateMessage { .. } | E::InappropriateHandshakeMessage { .. } => {
            "unexpected_message"
        }
        _ => "other",
    }
}

fn alert_reason(alert: rustls::AlertDescription) -> &'static str {
    use rustls::AlertDescription as A;
    match alert {
        A::CloseNotify => "alert_close_notify",
        A::UnexpectedMessage => "alert_unexpected_message",
        A::BadRecordMac => "alert_bad_record_mac",
        A::HandshakeFailure => "alert_handshake_failure",
        A::BadCertificate => "alert_bad_certificate",
        A::UnsupportedCertificate => "alert_unsupported_certificate",
        A::CertificateRevoked => "alert_certificate_revoked",
        A::CertificateExpired => "alert_certificate_expired",
        A::CertificateUnknown => "alert_certificate_unknown",
        A::IllegalParameter => "alert_illegal_parameter",
        A::UnknownCA => "alert_unknown_ca",
        A::AccessDenied => "alert_access_denied",
        A::DecodeError => "alert_decode_error",
        A::DecryptError => "alert_decrypt_error",
        A::ProtocolVersion => "alert_protocol_version",
        A::InsufficientSecurity => "alert_insufficient_security",
        A::InternalError => "alert_internal_error",
        A::UserCanceled => "alert_user_canceled",
        A::UnrecognisedName => "alert_unrecognised_name",
        A::NoApplicationProtocol => "alert_no_application_protocol",
        _ => "alert_other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::TLS_REFUSAL_REASONS;

    /// Every reason a TLS refusal can be counted with is one of the series `/metrics` lists
    /// from the start, whichever alert a client sends.
    #[test]
    fn every_alert_is_a_listed_refusal_reason() {
        for code in 0..=u8::MAX {
            let reason = alert_reason(rustls::AlertDescription::from(code));
            assert!(TLS_REFUSAL_REASONS.contains(&reason), "{reason} is not listed");
        }
        for error in [
            rustls::Error::DecryptError,
            rustls::Error::NoApplicationProtocol,
            rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType),
            rustls::Error::General("x".into()),
        ] {
            for established in [false, true] {
                let reason = error_reason(&error, established);
                assert!(TLS_REFUSAL_REASONS.contains(&reason), "{reason} is not listed");
            }
        }
    }
}
