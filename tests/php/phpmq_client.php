<?php
// A PHPMQ client written from the protocol spec (shared/specs/phpmq.md) with plain PHP sockets, the
// way PHP applications speak to pzq's PHPMQ port. Used by tests/test_phpmq_php.py.
//
//   php phpmq_client.php HOST PORT send QUEUE BODY [TTL]        (3-packet 001 with TTL: current dialect)
//   php phpmq_client.php HOST PORT send-legacy QUEUE BODY       (2-packet 001: legacy dialect)
//   php phpmq_client.php HOST PORT consume QUEUE N ACTION [TTL] ACTION: ack|requeue|dead|none
// consume prints each dispatched message as a JSON line {"queue","id","body","ttl","packets"} and
// applies ACTION to it; it exits 3 if fewer than N arrive within 5 seconds.

function phpmq_header(int $type, int $count): string { return sprintf("H01%03d%02d", $type, $count); }
function phpmq_packet(int $type, string $content): string { return sprintf("P%02d%029d", $type, strlen($content)) . $content; }
function phpmq_message(int $type, array $packets): string {
    $out = phpmq_header($type, count($packets));
    foreach ($packets as [$t, $c]) { $out .= phpmq_packet($t, $c); }
    return $out;
}
function read_exactly($sock, int $n): string {
    $buf = '';
    while (strlen($buf) < $n) {
        $chunk = fread($sock, $n - strlen($buf));
        if ($chunk === false || $chunk === '') {
            $meta = stream_get_meta_data($sock);
            if ($meta['timed_out']) { fwrite(STDERR, "timed out\n"); exit(3); }
            if (feof($sock)) { fwrite(STDERR, "connection closed\n"); exit(4); }
            continue;
        }
        $buf .= $chunk;
    }
    return $buf;
}
function read_message($sock): array {
    $h = read_exactly($sock, 8);
    if (substr($h, 0, 3) !== 'H01') { fwrite(STDERR, "bad header $h\n"); exit(5); }
    $type = (int)substr($h, 3, 3);
    $count = (int)substr($h, 6, 2);
    $packets = [];
    for ($i = 0; $i < $count; $i++) {
        $ph = read_exactly($sock, 32);
        $packets[(int)substr($ph, 1, 2)] = read_exactly($sock, (int)substr($ph, 3));
    }
    return [$type, $packets, $count];
}

[$_, $host, $port, $command] = array_slice($argv, 0, 4);
$sock = stream_socket_client("tcp://$host:$port", $errno, $errstr, 5);
if (!$sock) { fwrite(STDERR, "connect failed: $errstr\n"); exit(2); }
stream_set_timeout($sock, 5);

if ($command === 'send') {
    fwrite($sock, phpmq_message(1, [[1, $argv[4]], [2, $argv[5]], [5, $argv[6] ?? '0']]));
} elseif ($command === 'send-legacy') {
    fwrite($sock, phpmq_message(1, [[1, $argv[4]], [2, $argv[5]]]));
} elseif ($command === 'consume') {
    [$queue, $n, $action] = [$argv[4], (int)$argv[5], $argv[6]];
    fwrite($sock, phpmq_message(2, [[1, $queue], [4, (string)$n]]));
    for ($i = 0; $i < $n; $i++) {
        [$type, $packets, $count] = read_message($sock);
        echo json_encode(['type' => $type, 'queue' => $packets[1], 'body' => base64_encode($packets[2]),
                          'id' => $packets[3], 'ttl' => $packets[5] ?? null, 'packets' => $count]), "\n";
        if ($action === 'ack') {
            fwrite($sock, phpmq_message(4, [[1, $queue], [3, $packets[3]]]));
        } elseif ($action === 'requeue') {
            fwrite($sock, phpmq_message(5, [[1, $queue], [3, $packets[3]], [5, $argv[7] ?? '0']]));
        } elseif ($action === 'dead') {
            fwrite($sock, phpmq_message(6, [[1, $queue], [3, $packets[3]]]));
        }
    }
}
fflush($sock);
fclose($sock);
