/* The node's pod sandbox process (the "pause" container): holds the pod's namespaces
 * open until the runtime stops it. As PID 1 of the pod it reaps orphaned children and
 * exits on SIGINT/SIGTERM, so stopping a sandbox takes no kill timeout. tailcut writes
 * its own because no image registry is reachable on the machines it is built on. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction on_stop = {.sa_handler = stop};
    struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    if (sigaction(SIGINT, &on_stop, NULL) || sigaction(SIGTERM, &on_stop, NULL) ||
        sigaction(SIGCHLD, &on_child, NULL))
        return 1;
    for (;;)
        pause();
}
