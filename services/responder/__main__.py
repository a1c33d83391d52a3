from services.responder.main import main

main()
