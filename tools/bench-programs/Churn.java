// Source for tools/bench's javac workload, which compiles it: a real JVM
// program (javac) whose native allocations come from the JVM's runtime,
// class loading and JIT compilers, called in part from compiled Java code
// (frames without CFI, rbp a register like any other). Run, it churns zlib
// streams: each Deflater and Inflater mallocs its native state.
import java.util.zip.Deflater;
import java.util.zip.Inflater;

public class Churn {
    public static void main(String[] args) throws Exception {
        int rounds = args.length > 0 ? Integer.parseInt(args[0]) : 20000;
        byte[] input = new byte[4096];
        for (int i = 0; i < input.length; i++) input[i] = (byte) (i * 31 % 17);
        byte[] packed = new byte[8192];
        byte[] unpacked = new byte[8192];
        long total = 0;
        for (int r = 0; r < rounds; r++) {
            Deflater deflater = new Deflater(r % 9 + 1);
            deflater.setInput(input);
            deflater.finish();
            int n = deflater.deflate(packed);
            deflater.end();
            Inflater inflater = new Inflater();
            inflater.setInput(packed, 0, n);
            total += inflater.inflate(unpacked);
            inflater.end();
        }
        System.out.println(total);
    }
}
