/* Address-space growth of known kinds between markers, for the
 * address-space summary:
 *
 *   A -> B   3 threads started and kept waiting: Stack grows by 3 stacks
 *            and their guard pages (sizes printed as "stack=N guard=N").
 *   B -> C   an anonymous private mmap of 4 MiB, 1 MiB of it touched.
 *   C -> D   a 2 MiB file mapped shared (MappedFile), read through.
 *   D -> E   malloc(3 MiB) (a malloc mmapped block: Heap), touched;
 *            tracked live bytes grow by exactly 3145728.
 * Then the threads are released and joined; exit 0.
 * argv[1]: path of a scratch file to create for the file mapping.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <heapsnap/heapsnap.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t release = PTHREAD_COND_INITIALIZER;
static pthread_cond_t started_cond = PTHREAD_COND_INITIALIZER;
static int released = 0;
static int started = 0;

static void* wait_thread(void* arg) {
    (void)arg;
    pthread_mutex_lock(&lock);
    started++;
    pthread_cond_signal(&started_cond);
    while (!released) pthread_cond_wait(&release, &lock);
    pthread_mutex_unlock(&lock);
    return NULL;
}

int main(int argc, char** argv) {
    if (argc < 2) return 2;
    pthread_attr_t attr;
    size_t stack = 0, guard = 0;
    pthread_attr_init(&attr);
    pthread_attr_getstacksize(&attr, &stack);
    pthread_attr_getguardsize(&attr, &guard);
    printf("stack=%zu guard=%zu\n", stack, guard);
    fflush(stdout);

    heapsnap_marker("A");
    pthread_t threads[3];
    for (int i = 0; i < 3; ++i) pthread_create(&threads[i], NULL, wait_thread, NULL);
    /* Every thread is running (and its start recorded) before B. */
    pthread_mutex_lock(&lock);
    while (started < 3) pthread_cond_wait(&started_cond, &lock);
    pthread_mutex_unlock(&lock);
    heapsnap_marker("B");

    char* anon = mmap(NULL, 4 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(anon, 1, 1 << 20);
    heapsnap_marker("C");

    int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, 2 << 20) != 0) return 3;
    char* file = mmap(NULL, 2 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    memset(file, 2, 2 << 20);
    heapsnap_marker("D");

    char* big = malloc(3 << 20);
    memset(big, 3, 3 << 20);
    heapsnap_marker("E");

    pthread_mutex_lock(&lock);
    released = 1;
    pthread_cond_broadcast(&release);
    pthread_mutex_unlock(&lock);
    for (int i = 0; i < 3; ++i) pthread_join(threads[i], NULL);
    munmap(file, 2 << 20);
    close(fd);
    free(big);
    munmap(anon, 4 << 20);
    return 0;
}
