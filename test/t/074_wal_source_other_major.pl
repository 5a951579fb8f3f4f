# A WAL source of another PostgreSQL major than this server's (SPEC 16 of
# the issue, docs/SPEC.md 19): the source is the real server of that major
# from the chroot of the Debian suite that ships it (scripts/test.sh makes
# it: EG_OTHER_MAJOR, EG_OTHER_MAJOR_ROOT), run as user postgres in a user
# namespace rooted there, with no eventgrid, reached over TCP with a
# password by a role with REPLICATION alone.
#   - its values of many built-in types arrive as they are in the source
#     (numbers, numeric, booleans, timestamps with the source's DateStyle
#     'SQL, DMY' and TimeZone, dates, intervals, jsonb, arrays, uuid,
#     bytea), in table changes and in a backfill of the rows it held;
#   - messages, and exactly once in commit order through a kill -9 of the
#     worker and a restart of the source.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $root = $ENV{EG_OTHER_MAJOR_ROOT} // '';
my $major = $ENV{EG_OTHER_MAJOR} // '';
plan skip_all => 'no server of another PostgreSQL major here (scripts/test.sh makes one from a chroot on the host; not inside a chroot suite)'
  unless $major =~ /^\d+$/ && -x "$root/usr/lib/postgresql/$major/bin/postgres";

# --- the source: PostgreSQL $major from the chroot, as the chroot's postgres user
my ($uid, $gid);
open(my $pw, '<', "$root/etc/passwd") or die "$root/etc/passwd: $!";
while (<$pw>) { ($uid, $gid) = (split /:/)[2, 3] if /^postgres:/ }
close $pw;
die "no postgres user in $root" unless defined $uid;
my $dir = "/tmp/eventgrid-source-$$";
mkdir "$root$dir" or die "$root$dir: $!";
my $port = PostgreSQL::Test::Cluster::get_free_port();
sub in_root
{
	my ($prog, @args) = @_;
	return ('unshare', "--map-user=$uid", "--map-group=$gid", "--root=$root", "/usr/lib/postgresql/$major/bin/$prog", @args);
}
END
{
	if (defined $dir && -d "$root$dir")
	{
		system(in_root('pg_ctl', '-D', "$dir/data", '-m', 'immediate', 'stop')) if -f "$root$dir/data/postmaster.pid";
		system('rm', '-rf', "$root$dir");
	}
}
command_ok([ in_root('initdb', '-D', "$dir/data", '-A', 'trust', '-U', 'postgres', '--no-sync') ], "initdb of PostgreSQL $major");
open(my $conf, '>>', "$root$dir/data/postgresql.conf") or die;
print $conf "port = $port\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '$dir'\nwal_level = logical\n"
  . "password_encryption = 'scram-sha-256'\nfsync = off\n"
  # what the source's own sessions default to: not what this server reads
  . "datestyle = 'SQL, DMY'\ntimezone = 'Asia/Kolkata'\nintervalstyle = 'sql_standard'\nextra_float_digits = 0\n";
close $conf;
open(my $hba, '>', "$root$dir/data/pg_hba.conf") or die;
print $hba "local all postgres trust\nhost all postgres 127.0.0.1/32 trust\nhost postgres app_repl 127.0.0.1/32 scram-sha-256\n";
close $hba;
sub source_start { command_ok([ in_root('pg_ctl', '-D', "$dir/data", '-l', "$dir/server.log", '-w', @_) ], "source: pg_ctl @_") }
source_start('start');
sub app
{
	my ($sql) = @_;
	my ($out, $err);
	IPC::Run::run([ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-h', '127.0.0.1', '-p', $port, '-U', 'postgres', '-d', 'postgres', '-c', $sql ],
		'>', \$out, '2>', \$err) or die "source: $sql: $err";
	chomp $out;
	return $out;
}
like(app('SELECT version()'), qr/^PostgreSQL $major\./, "the source runs PostgreSQL $major");
app(q{CREATE TABLE public.kinds (id int8 PRIMARY KEY, n numeric, f float8, ok bool, at timestamptz, day date,
		span interval, doc jsonb, tags text[], u uuid, raw bytea, note text)});
app(q{INSERT INTO public.kinds VALUES (1, 12345.678, 0.1, true, '2024-05-01 12:30:00+00', '2024-05-31', '1 day 02:03:04',
		'{"a": [1, 2]}', '{x,"y z"}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '\xdeadbeef', 'before')});
app(q{CREATE PUBLICATION app_pub FOR TABLE public.kinds});
app(q{CREATE ROLE app_repl LOGIN REPLICATION PASSWORD 'repl-secret-42'; GRANT SELECT ON public.kinds TO app_repl});
my $conn = "host=127.0.0.1 port=$port dbname=postgres user=app_repl password=repl-secret-42";

# --- this server
my $node = new_node('othermajor', restart_after_crash => 'on');
my $r = start_receiver();
sub sql { return $node->safe_psql('postgres', shift) }
my $here = int(sql('SHOW server_version_num') / 10000);
isnt($here, $major, "this server (PostgreSQL $here) is of another major than the source ($major)");
sql("SELECT eventgrid.create_topic('kinds')");
sql("SELECT eventgrid.create_event_subscription('kinds', 'hook', '$r->{url}/status/200/kinds', max_events_per_batch => 100,"
	  . " ordering_key => 'data.schema')");
sql("BEGIN; SELECT eventgrid.create_wal_source('app', '$conn', 'app_pub', backfill => true);"
	  . " SELECT eventgrid.publish_table_changes('public.kinds', 'kinds', source => 'app'); COMMIT;");
ok(wait_for_sql($node, "SELECT state || ' ' || backfilled_rows FROM eventgrid.wal_sources", 'streaming 1', 60),
	"the source of PostgreSQL $major backfilled its row and streams")
  or diag(sql("SELECT last_error FROM eventgrid.wal_sources"));

app(q{INSERT INTO public.kinds VALUES (2, -0.5, 1e-7, false, '2024-12-31 23:59:59.5+05:30', '2025-01-02', '-3 hours',
		'[true, null]', '{}', '00000000-0000-0000-0000-000000000000', '\x00ff', 'after')});
app(q{BEGIN; UPDATE public.kinds SET note = 'changed' WHERE id = 1;
	SELECT pg_logical_emit_message(true, 'eventgrid', '{"topic": "kinds", "event": {"id": "m-1", "subject": "/m", "eventType": "App.Note",
		"eventTime": "2024-05-01T12:00:00Z", "data": {"schema": "public"}}}'); COMMIT;});
my @got = wait_for_events($r, '/status/200/kinds', 4);
is(join(',', map { $_->{eventType} } @got), 'public.kinds.Backfilled,public.kinds.Inserted,public.kinds.Updated,App.Note',
	'the backfill, an insert, an update and a message, in commit order');
my $typed = { id => 1, n => 12345.678, f => 0.1, ok => JSON::PP::true, at => '2024-05-01T12:30:00+00:00', day => '2024-05-31',
	span => '1 day 02:03:04', doc => { a => [ 1, 2 ] }, tags => [ 'x', 'y z' ], u => 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
	raw => '\\xdeadbeef', note => 'before' };
is_deeply($got[0]{data}{new}, $typed, 'a backfilled row: each type\'s value as the source holds it, whatever its DateStyle and TimeZone');
is_deeply($got[1]{data}{new}, { id => 2, n => -0.5, f => 1e-7, ok => JSON::PP::false, at => '2024-12-31T18:29:59.5+00:00',
		day => '2025-01-02', span => '-03:00:00', doc => [ JSON::PP::true, undef ], tags => [], u => '00000000-0000-0000-0000-000000000000',
		raw => '\\x00ff', note => 'after' }, 'an inserted row from the stream: the same');
is_deeply($got[2]{data}{new}, { %$typed, note => 'changed' }, 'an updated row');
is($got[3]{id}, 'm-1', 'a message keeps its id');

# --- exactly once through a kill -9 of the worker and a restart of the source
app(q{CREATE TABLE public.txlog (t int)});
my $writer = q{DO $$ BEGIN FOR t IN 1 .. 100 LOOP
	UPDATE public.kinds SET note = 'v' || t WHERE id = 2; INSERT INTO public.txlog VALUES (t); COMMIT; PERFORM pg_sleep(0.01);
	END LOOP; END $$};
my $bg = IPC::Run::start([ 'psql', '-XAtq', '-h', '127.0.0.1', '-p', $port, '-U', 'postgres', '-d', 'postgres', '-c', $writer ],
	'>', \my $bgout, '2>', \my $bgerr);
usleep(300_000);
my $pid = sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventgrid WAL source'");
ok($pid, "the WAL source worker (pid $pid)");
kill 'KILL', $pid;
usleep(300_000);
source_start('-m', 'fast', 'restart');    # the writer ends with it
$bg->finish;
my $updates = app('SELECT count(*) FROM public.txlog');
cmp_ok($updates, '>', 0, "$updates updates committed on the source before its restart");
ok(wait_for_sql($node, "SELECT events_published FROM eventgrid.wal_sources", 4 + $updates, 120),
	'each published once (events_published)') or diag(sql("SELECT * FROM eventgrid.wal_sources"));
my @all;
my %by_id;
for (1 .. scaled(60) * 10)
{
	@all = received_events($r, '/status/200/kinds');
	%by_id = map { ($_->{id} => $_) } @all;
	last if keys(%by_id) >= 4 + $updates;
	usleep(100_000);
}
is(scalar(keys %by_id), 4 + $updates, 'and every one arrived');
my %first;
my @versions = map { $_->{data}{new}{note} =~ /^v(\d+)$/ ? $1 : () } grep { !$first{ $_->{id} }++ } @all;
is(join(',', @versions), join(',', 1 .. $updates), 'in commit order');

unlike(slurp_file($node->logfile), qr/terminated by signal (11|6)/, 'no worker crashed (a kill -9 aside)');
done_testing();
