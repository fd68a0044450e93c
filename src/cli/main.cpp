// vitrain command-line entry point (placeholder until the subcommands land).
#include <cstdio>
int main() { return 0; }
