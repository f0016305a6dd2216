//! A deterministic two-peer harness: a client and a server [`Connection`] wired back to back in
//! memory, in virtual time (the idea of quinn-proto's `Pair`). No sockets, no sleeps.
#![allow(dead_code)]

use bytes::BytesMut;
use std::time::{Duration, Instant};
use topspin_proto::{Connection, Event, ProtocolError, Settings, Side};

/// Which way bytes flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    ToServer,
    ToClient,
}

pub struct Pair {
    pub client: Connection,
    pub server: Connection,
    pub now: Instant,
    pub client_events: Vec<Event>,
    pub server_events: Vec<Event>,
    to_server: BytesMut,
    to_client: BytesMut,
    /// Total bytes moved each way.
    pub bytes_to_server: usize,
    pub bytes_to_client: usize,
    pub client_error: Option<ProtocolError>,
    pub server_error: Option<ProtocolError>,
}

impl Pair {
    /// A pair with these settings, handshake completed, events of the handshake drained.
    pub fn new(client: Settings, server: Settings) -> Pair {
        let mut p = Pair {
            client: Connection::new(Side::Client, client),
            server: Connection::new(Side::Server, server),
            now: Instant::now(),
            client_events: Vec::new(),
            server_events: Vec::new(),
            to_server: BytesMut::new(),
            to_client: BytesMut::new(),
            bytes_to_server: 0,
            bytes_to_client: 0,
            client_error: None,
            server_error: None,
        };
        p.drive();
        assert_eq!(p.take_client(), vec![Event::Established]);
        assert_eq!(p.take_server(), vec![Event::Established]);
        p
    }

    pub fn default_pair() -> Pair {
        Pair::new(Settings::default(), Settings::default())
    }

    /// Moves bytes one step in one direction; returns how many moved.
    pub fn step(&mut self, dir: Dir) -> usize {
        let (from, to, buf, err) = match dir {
            Dir::ToServer => (
                &mut self.client,
                &mut self.server,
                &mut self.to_server,
                &mut self.server_error,
            ),
            Dir::ToClient => (
                &mut self.server,
                &mut self.client,
                &mut self.to_client,
                &mut self.client_error,
            ),
        };
        let mut moved = 0;
        while let Some(b) = from.poll_transmit() {
            moved += b.len();
            buf.extend_from_slice(&b);
        }
        if moved > 0 || !buf.is_empty() {
            if let Err(e) = to.handle_input(buf, self.now) {
                err.get_or_insert(e);
                buf.clear();
            }
        }
        match dir {
            Dir::ToServer => self.bytes_to_server += moved,
            Dir::ToClient => self.bytes_to_client += moved,
        }
        self.collect();
        moved
    }

    pub fn collect(&mut self) {
        while let Some(e) = self.client.poll_event() {
            self.client_events.push(e);
        }
        while let Some(e) = self.server.poll_event() {
            self.server_events.push(e);
        }
    }

    /// Moves bytes both ways until both sides are quiet.
    pub fn drive(&mut self) {
        for _ in 0..10_000 {
            let a = self.step(Dir::ToServer);
            let b = self.step(Dir::ToClient);
            if a == 0 && b == 0 {
                return;
            }
        }
        panic!("pair did not go quiet");
    }

    /// Advances virtual time, fires timeouts on both sides and drives.
    pub fn advance(&mut self, d: Duration) {
        self.now += d;
        self.client.handle_timeout(self.now);
        self.server.handle_timeout(self.now);
        self.collect();
        self.drive();
    }

    pub fn take_client(&mut self) -> Vec<Event> {
        self.collect();
        std::mem::take(&mut self.client_events)
    }

    pub fn take_server(&mut self) -> Vec<Event> {
        self.collect();
        std::mem::take(&mut self.server_events)
    }

    /// Feeds raw bytes to one side as if the peer sent them.
    pub fn inject(&mut self, dir: Dir, bytes: &[u8]) -> Result<(), ProtocolError> {
        let mut b = BytesMut::from(bytes);
        let r = match dir {
            Dir::ToServer => self.server.handle_input(&mut b, self.now),
            Dir::ToClient => self.client.handle_input(&mut b, self.now),
        };
        self.collect();
        r
    }
}
