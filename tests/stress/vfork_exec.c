/* vfork_exec — vfork + exec, and the exec'd child recorded in its own log.
 *
 * Without arguments (the parent): parent_keep() keeps malloc(1111); then
 *   1. vfork, and the child execve()s this program with argument "child";
 *   2. vfork, and the child execve()s a path that does not exist, then
 *      _exit(127) (a vfork child that never execs must not touch the
 *      parent's recorder: it shares the parent's memory);
 *   prints "vfork_exec: child 0, missing 127" and exits 0.
 * With "child": child_keep() keeps malloc(2222), prints
 *   "vfork_exec child: hello", exits 0.
 * With "execl": exec_keep() keeps malloc(3333), prints "vfork_exec: execl",
 *   then execl()s this program with "child" (no fork): the log of the
 *   pre-exec image must end with an End record of reason exec and hold the
 *   block; the new image writes its own log.
 * With "fexecve" or "execveat": the same, through fexecve() on a
 *   descriptor of this program, or execveat() with AT_EMPTY_PATH on one
 *   (printing "vfork_exec: fexecve" or "vfork_exec: execveat").
 *
 * Live at exit: parent 1111 bytes from parent_keep(); child 2222 bytes from
 * child_keep(). Exit status 0; 3 if a child's status is not as expected.
 */
#define _GNU_SOURCE  /* execveat, AT_EMPTY_PATH */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

static void* volatile kept;

__attribute__((noinline)) void parent_keep(void) {
    kept = malloc(1111); /* @site:parent_keep */
}

__attribute__((noinline)) void child_keep(void) {
    kept = malloc(2222); /* @site:child_keep */
}

__attribute__((noinline)) void exec_keep(void) {
    kept = malloc(3333); /* @site:exec_keep */
}

static int vfork_exec(const char* path, char* const argv[]) {
    pid_t pid = vfork();
    if (pid < 0) return -1;
    if (pid == 0) {
        execve(path, argv, environ);
        _exit(127);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
    return WEXITSTATUS(status);
}

int main(int argc, char** argv) {
    if (argc == 2 && strcmp(argv[1], "child") == 0) {
        child_keep();
        printf("vfork_exec child: hello\n");
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "execl") == 0) {
        exec_keep();
        printf("vfork_exec: execl\n");
        fflush(stdout);
        execl("/proc/self/exe", argv[0], "child", (char*)NULL);
        return 3;
    }
    if (argc == 2 && (strcmp(argv[1], "fexecve") == 0 || strcmp(argv[1], "execveat") == 0)) {
        exec_keep();
        printf("vfork_exec: %s\n", argv[1]);
        fflush(stdout);
        int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
        char* child_argv[] = {argv[0], "child", NULL};
        if (strcmp(argv[1], "fexecve") == 0)
            fexecve(fd, child_argv, environ);
        else
            execveat(fd, "", child_argv, environ, AT_EMPTY_PATH);
        return 3;
    }
    parent_keep();
    fflush(stdout);
    char* child_argv[] = {argv[0], "child", NULL};
    int child = vfork_exec("/proc/self/exe", child_argv);
    char* missing_argv[] = {"missing", NULL};
    int missing = vfork_exec("/nonexistent/heapsnap-test-missing", missing_argv);
    printf("vfork_exec: child %d, missing %d\n", child, missing);
    return child == 0 && missing == 127 ? 0 : 3;
}
