# EventGridTest: helpers for eventgrid's TAP integration tests.
#
# Starts real PostgreSQL clusters (PostgreSQL::Test::Cluster) with eventgrid
# preloaded, and the scriptable HTTP receiver test/receiver.py on 127.0.0.1;
# reads what the receiver got; moves the delivery worker's clock forward
# (GUC eventgrid.clock_offset) so retry schedules are tested without waiting
# real minutes.
package EventGridTest;

use strict;
use warnings;
use Exporter 'import';
use File::Basename qw(basename dirname);
use File::Spec;
use IO::Socket::INET;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

our @EXPORT = qw(scaled new_node start_receiver start_python_server start_nginx requests wait_for_requests advance_clock
  eg_event publish_events wait_for_sql planned_wait wait_recorded sql_error start_workers restart_workers worker_count
  openssl make_ca issue_certificate cpu_ticks source_cluster received_events wait_for_events);

my $json = JSON::PP->new->canonical;
my $clock_offset = 0;

# EG_TEST_TIME_FACTOR (default 1): how much longer than on a quiet machine
# every wait of the tests may take (a loaded machine: 2 or 3).  The waits
# of wait_for_sql(), wait_for_requests() and PostgreSQL::Test::Cluster's
# poll_query_until() (PG_TEST_TIMEOUT_DEFAULT) are multiplied by it; a
# test's own limits go through scaled().
my $time_factor = ($ENV{EG_TEST_TIME_FACTOR} // '') =~ /^\d+(\.\d+)?$/ ? $ENV{EG_TEST_TIME_FACTOR} : 1;
$PostgreSQL::Test::Utils::timeout_default = int(180 * $time_factor) unless defined $ENV{PG_TEST_TIMEOUT_DEFAULT};

# $secs seconds on a quiet machine, as long as EG_TEST_TIME_FACTOR says here.
sub scaled
{
	my ($secs) = @_;
	return $secs * $time_factor;
}
my @receivers;

# receivers are stopped when the test script ends; reaping them must not
# change the script's exit status
END
{
	my $status = $?;
	$_->kill_kill for @receivers;
	$? = $status;
}

# A started cluster with eventgrid preloaded and created in database postgres.
# Jitter is off so retry times can be checked exactly.  Workers that have
# had work stay for an hour when idle (eventgrid.worker_idle_timeout), so
# that a test finds them where it left them; those that find no work
# still leave at once.
sub new_node
{
	my ($name, %conf) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init;
	my %all = (
		shared_preload_libraries => "'eventgrid'",
		'eventgrid.retry_jitter_percent' => 0,
		'eventgrid.response_timeout' => "'2s'",
		'eventgrid.worker_idle_timeout' => "'1h'",
		%conf);
	$node->append_conf('postgresql.conf',
		join('', map { "$_ = $all{$_}\n" } sort keys %all));
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION eventgrid');
	$clock_offset = 0;
	return $node;
}

# Starts the Python server test/$script with --port $port (a free port
# when undef) and @args, waits until it accepts connections, and stops it
# when the test script ends; returns {port, url, handle}.
sub start_python_server
{
	my ($script, $port, @args) = @_;
	$port //= PostgreSQL::Test::Cluster::get_free_port();
	my $path = File::Spec->rel2abs(dirname(__FILE__) . "/../$script");
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start([ '/usr/bin/python3', $path, '--port', $port, @args ], '>', \$out, '2>', \$err);
	push @receivers, $h;
	for (1 .. 100)
	{
		my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Proto => 'tcp');
		if ($s) { close $s; last; }
		usleep(100_000);
	}
	return { port => $port, url => "http://127.0.0.1:$port", handle => $h };
}

# Starts test/receiver.py on a free port; returns {port, url, log, handle}.
# The log is named after the test script and the port: tmp_check is shared
# by the whole run and a port is free again once the test that held it has
# ended, so a log named by the port alone would carry an earlier test's
# requests into this one's counts (027 counted one that way).
sub start_receiver
{
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $test = basename($0, '.pl');
	my $log = "$PostgreSQL::Test::Utils::tmp_check/receiver_${test}_$port.jsonl";
	unlink($log);
	return { %{ start_python_server('receiver.py', $port, '--log', $log) }, log => $log };
}

# Starts Debian's nginx with its files in $dir: one worker process, the
# lines $http inside its http block (server blocks, logs); stopped when the
# test script ends.
my @nginx_pids;
sub start_nginx
{
	my ($dir, $http) = @_;
	open(my $fh, '>', "$dir/nginx.conf") or die "$dir/nginx.conf: $!";
	print $fh <<"CONF";
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/nginx-error.log;
events { worker_connections 1024; }
http {
    client_body_temp_path $dir/client_body;
    proxy_temp_path $dir/proxy;
    fastcgi_temp_path $dir/fastcgi;
    uwsgi_temp_path $dir/uwsgi;
    scgi_temp_path $dir/scgi;
$http
}
CONF
	close($fh);
	my $nginx = -x '/usr/sbin/nginx' ? '/usr/sbin/nginx' : 'nginx';	# Debian's, not on a user's PATH
	my $err = '';
	IPC::Run::run([ $nginx, '-c', "$dir/nginx.conf", '-p', $dir, '-e', "$dir/nginx-error.log" ], '2>', \$err)
	  or BAIL_OUT("nginx did not start: $err");
	push @nginx_pids, "$dir/nginx.pid";
	return;
}
END { for my $f (@nginx_pids) { kill 'TERM', slurp_file($f) if -f $f } }

# Runs Debian's openssl with @args; its standard output.  Bails out if it fails.
sub openssl
{
	my @args = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'openssl', @args ], '>', \$out, '2>', \$err)
	  or BAIL_OUT("openssl @args failed: $err");
	return $out;
}

# A throwaway certificate authority in $dir: "$dir/$ca.pem" (self-signed,
# CN "eventgrid test $ca", valid $days days) and "$dir/$ca.key", with what
# `openssl ca` needs to sign with it (issue_certificate), which gives each
# certificate the key identifiers strict verifiers require.
sub make_ca
{
	my ($dir, $ca, $days) = @_;
	open(my $fh, '>', "$dir/$ca.cnf") or die "$dir/$ca.cnf: $!";
	print $fh <<"CNF";
[ ca ]
default_ca = test_ca
[ test_ca ]
dir = $dir
database = $dir/$ca-index.txt
new_certs_dir = $dir
serial = $dir/$ca-serial
default_md = sha256
policy = anything
copy_extensions = copy
x509_extensions = leaf
[ anything ]
commonName = supplied
[ leaf ]
basicConstraints = CA:FALSE
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid,issuer
CNF
	close($fh);
	open($fh, '>', "$dir/$ca-index.txt") or die;
	close($fh);
	open($fh, '>', "$dir/$ca-serial") or die;
	print $fh "1000\n";
	close($fh);
	# with the key usage strict verifiers ask of a CA (Python 3.13's ssl: VERIFY_X509_STRICT)
	openssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', "$dir/$ca.key", '-out', "$dir/$ca.pem",
		'-days', $days, '-subj', "/CN=eventgrid test $ca", '-addext', 'keyUsage=critical,keyCertSign,cRLSign');
	return;
}

# A certificate "$dir/$name.pem" (subject CN=$name, subjectAltName $san
# when given) and its key "$dir/$name.key", signed by make_ca()'s $ca;
# @dates: '-days', N or '-startdate', ..., '-enddate', ...
sub issue_certificate
{
	my ($dir, $ca, $name, $san, @dates) = @_;
	openssl('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', "$dir/$name.key", '-out', "$dir/$name.csr",
		'-subj', "/CN=$name", $san ? ('-addext', "subjectAltName=$san") : ());
	openssl('ca', '-batch', '-config', "$dir/$ca.cnf", '-cert', "$dir/$ca.pem", '-keyfile', "$dir/$ca.key",
		'-in', "$dir/$name.csr", '-out', "$dir/$name.pem", '-notext', @dates);
	return;
}

# Requests the receiver got so far, optionally only those to a path.
sub requests
{
	my ($r, $path) = @_;
	my @reqs;
	open(my $fh, '<', $r->{log}) or return ();
	while (my $line = <$fh>)
	{
		next unless $line =~ /\n$/;
		my $req = $json->decode($line);
		push @reqs, $req if !defined $path || $req->{path} eq $path;
	}
	close $fh;
	return @reqs;
}

# Waits until at least $n requests to $path arrived (at most $secs seconds).
sub wait_for_requests
{
	my ($r, $path, $n, $secs) = @_;
	$secs = scaled($secs // 60);
	for (1 .. $secs * 10)
	{
		my @got = requests($r, $path);
		return @got if @got >= $n;
		usleep(100_000);
	}
	return requests($r, $path);
}

# Moves the worker's clock $secs seconds further ahead and wakes it.
sub advance_clock
{
	my ($node, $secs) = @_;
	$clock_offset += $secs;
	$node->safe_psql('postgres',
		"ALTER SYSTEM SET eventgrid.clock_offset = '${clock_offset}s'; SELECT pg_reload_conf();");
	return $clock_offset;
}

# Seconds the worker planned to wait after the last recorded attempt of
# subscription $sub's one retry.
sub planned_wait
{
	my ($node, $sub) = @_;
	return $node->safe_psql('postgres',
		"SELECT extract(epoch FROM d.next_attempt_at - d.last_attempt_at)::int FROM eventgrid.retries d "
		  . "JOIN eventgrid.event_subscriptions s ON s.id = d.subscription_id WHERE s.name = '$sub'");
}

# Waits until subscription $sub's one retry has $attempts attempts recorded
# and is not leased.
sub wait_recorded
{
	my ($node, $sub, $attempts) = @_;
	return wait_for_sql($node,
		"SELECT count(*) FROM eventgrid.retries d JOIN eventgrid.event_subscriptions s ON s.id = d.subscription_id "
		  . "WHERE s.name = '$sub' AND d.attempts = $attempts AND d.lease_owner IS NULL", '1');
}

# An Event Grid schema event as JSON text.
sub eg_event
{
	my ($id, %extra) = @_;
	return $json->encode({
		id => $id,
		subject => "/orders/$id",
		eventType => 'Shop.OrderCreated',
		eventTime => '2024-05-01T12:00:00Z',
		data => { orderId => $id },
		%extra });
}

# Publishes one eg_event() per id to $topic in database postgres, in one INSERT.
sub publish_events
{
	my ($node, $topic, @ids) = @_;
	$node->safe_psql('postgres', "INSERT INTO eventgrid.events (topic, event) VALUES "
		  . join(',', map { "('$topic', '" . eg_event($_) . "')" } @ids));
	return;
}

# Polls until $sql returns $expected (compared as text) in database $db
# (default postgres); connection failures while the server restarts count
# as not yet.
sub wait_for_sql
{
	my ($node, $sql, $expected, $secs, $db) = @_;
	$secs = scaled($secs // 60);
	$db //= 'postgres';
	my $got = '';
	# psql may go before it has read its input (a server in crash recovery
	# refuses the connection): IPC::Run then dies writing to it ("ack Broken
	# pipe"), which counts as one more failed try
	local $SIG{PIPE} = 'IGNORE';
	for (1 .. $secs * 10)
	{
		my $ret = eval { $node->psql($db, $sql, stdout => \$got, on_error_die => 0) } // 1;
		return 1 if $ret == 0 && $got eq $expected;
		usleep(100_000);
	}
	diag("waited for [$sql] = [$expected], last got [$got]");
	return 0;
}

# How many eventgrid workers of $type ('delivery worker', 'upkeep worker')
# run in database $db (default postgres).
sub worker_count
{
	my ($node, $type, $db) = @_;
	$db //= 'postgres';
	return $node->safe_psql($db, "SET search_path = pg_catalog;"
		  . " SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'eventgrid $type' AND datname = current_database()");
}

# Starts database $db's workers (default postgres) without publishing, as a
# commit that publishes would, and waits until they run: workers run only
# while their database has work (they leave after
# eventgrid.worker_idle_timeout).  Returns whether they all started.
sub start_workers
{
	my ($node, $db) = @_;
	$db //= 'postgres';
	my $n = $node->safe_psql($db, "SHOW eventgrid.delivery_workers");
	$node->safe_psql($db, "SELECT eventgrid._wake_worker_at_commit()");
	return wait_for_sql($node,
		"SET search_path = pg_catalog; SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
		  . " AND backend_type IN ('eventgrid delivery worker', 'eventgrid upkeep worker')",
		$n + 1, 30, $db);
}

# Stops database $db's running workers (pg_terminate_backend), so that
# the next ones connect afresh (with new database settings), and starts
# them again.  Returns whether the new ones all run.
sub restart_workers
{
	my ($node, $db) = @_;
	$db //= 'postgres';
	# (search_path: the database's may plant operators, 006_hostile)
	my $q = "SET search_path = pg_catalog; SELECT string_agg(pid::text, ',') FROM pg_stat_activity"
	  . " WHERE datname = current_database() AND backend_type IN ('eventgrid delivery worker', 'eventgrid upkeep worker')";
	my $old = $node->safe_psql($db, $q);
	if ($old ne '')
	{
		$node->safe_psql($db, "SET search_path = pg_catalog; SELECT pg_terminate_backend(p) FROM unnest('{$old}'::int[]) p");
		wait_for_sql($node, "SET search_path = pg_catalog; SELECT count(*) FROM pg_stat_activity WHERE pid = ANY ('{$old}'::int[])",
			'0', 30, $db);
	}
	return start_workers($node, $db);
}

# What psql prints when $sql fails in database postgres (verbose: with the
# SQLSTATE), run as role $user (SET ROLE) when one is given; 'no error'
# when it succeeds.
# The CPU the processes @pids used so far: clock ticks of utime + stime
# from /proc/<pid>/stat (a process gone counts 0).
sub cpu_ticks
{
	my $sum = 0;
	for my $pid (@_)
	{
		open(my $fh, '<', "/proc/$pid/stat") or next;
		my @f = split / /, (split /\) /, <$fh>)[1];
		$sum += $f[11] + $f[12];    # utime + stime
	}
	return $sum;
}

sub sql_error
{
	my ($node, $sql, $user) = @_;
	my ($ret, $out, $err) =
	  $node->psql('postgres', "\\set VERBOSITY verbose\n" . ($user ? "SET ROLE $user;\n" : '') . $sql);
	return $ret == 0 ? 'no error' : $err;
}

# A WAL source's server (SPEC 19): a plain cluster (no eventgrid) with
# wal_level = logical, started after $setup (SQL: its tables and
# publication) and reachable over TCP by the role app_repl (LOGIN
# REPLICATION and nothing else) with its password only (scram-sha-256), as
# a managed service has it.  Returns the cluster and app_repl's libpq
# connection string.
sub source_cluster
{
	my ($name, $setup) = @_;
	my $app = PostgreSQL::Test::Cluster->new($name);
	$app->init(allows_streaming => 'logical');
	$app->append_conf('postgresql.conf', "listen_addresses = '127.0.0.1'\npassword_encryption = 'scram-sha-256'\n");
	$app->start;
	$app->safe_psql('postgres', $setup . "; CREATE ROLE app_repl LOGIN REPLICATION PASSWORD 'repl-secret-42';");
	my $hba = $app->data_dir . '/pg_hba.conf';
	open(my $fh, '<', $hba) or die "$hba: $!";
	my $rules = join('', <$fh>);
	close $fh;
	open($fh, '>', $hba) or die "$hba: $!";
	print $fh "host postgres app_repl 127.0.0.1/32 scram-sha-256\n" . $rules;
	close $fh;
	$app->reload;
	return ($app, "host=127.0.0.1 port=" . $app->port . " dbname=postgres user=app_repl password=repl-secret-42");
}

# The events of every batch the receiver got so far at $path (each request's body is an array).
sub received_events
{
	my ($r, $path) = @_;
	return map { my $b = $json->decode($_->{body}); @$b } requests($r, $path);
}

# Waits until at least $n events arrived at $path (at most $secs seconds); the events.
sub wait_for_events
{
	my ($r, $path, $n, $secs) = @_;
	my @got;
	for (1 .. scaled($secs // 60) * 10)
	{
		@got = received_events($r, $path);
		last if @got >= $n;
		usleep(100_000);
	}
	return @got;
}

1;
