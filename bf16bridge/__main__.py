from bf16bridge.cli.main import console_main

console_main()
