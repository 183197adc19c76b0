# Hash churn for tools/bench: Debian's perl uses the system malloc, so
# every scalar, array and hash body here is a malloc'd block. Builds a hash
# of N entries (an array and a string each), then walks it deleting about
# a third, which leaves malloc holding many free chunks at exit.
use strict;
use warnings;

my $n = @ARGV ? $ARGV[0] : 300000;
my %h;
for my $i (1 .. $n) {
    $h{"k$i"} = [$i, "v" x ($i % 50)];
}
my $sum = 0;
for my $k (keys %h) {
    $sum += length($h{$k}[1]);
    delete $h{$k} if $sum % 3 == 0;
}
print scalar(keys %h), "\n";
